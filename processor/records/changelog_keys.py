"""How the changelog's records are keyed, and the headers a restore reads without
decoding a record: a run's snapshot is keyed by its run id; its fired marks, history and
remembered answers by keys that start with NUL.
"""

import json
import struct

from schemas.messages import RunSnapshot, Transition

#: Headers of a commit's records that carry what a partition store's indexes need, so a
#: restore reads them without decoding the record: the run's machine, state, time of
#: entry and timers on its changelog record; the revision and the proposal id, as
#: "<revision> <proposal id>", on its transition record.
INDEX_HEADER = "runstate-index"
REVISION_HEADER = "runstate-revision"


def revision_header(transition: Transition) -> bytes:
    return f"{transition.revision} {transition.proposal_id}".encode()


def parse_revision_header(raw: bytes) -> tuple[int, str | None]:
    """(revision, proposal id) of a REVISION_HEADER value; the proposal id is None in
    records written before it was added. ValueError when it is not one."""
    revision, _, proposal_id = raw.partition(b" ")
    return int(revision), (proposal_id.decode() if proposal_id else None)


#: (machine, state, entered_state_at_ms) and [(due_at_ms, revision, name), ...]
Where = tuple[str, str, int]
TimerMarks = list[tuple[int, int, str]]


#: Changelog keys that are not a run's snapshot start with NUL (no run id does):
#: fired marks (this prefix + run id) and the run's history (this prefix + run id + NUL +
#: revision, 8 bytes big-endian; the transition as published, so a restore needs only
#: the changelog, and a forgotten run's tombstones leave nothing of it to read).
FIRED_CHANGELOG_PREFIX = b"\x00fired\x00"
HISTORY_CHANGELOG_PREFIX = b"\x00history\x00"
#: A refusal the run remembers as its answer to a proposal id (`content_digest` set):
#: this prefix + run id + NUL + proposal id -> the rejection as published.
ANSWER_CHANGELOG_PREFIX = b"\x00answer\x00"


def answers_changelog_prefix(run_id: str) -> bytes:
    return ANSWER_CHANGELOG_PREFIX + run_id.encode() + b"\x00"


def answer_changelog_key(run_id: str, proposal_id: str) -> bytes:
    return answers_changelog_prefix(run_id) + proposal_id.encode()


def parse_answer_changelog_key(key: bytes) -> tuple[str, str]:
    """(run id, proposal id) of an answer key; ValueError when it is not one. Run ids
    hold no control characters, so the first NUL after the prefix ends the run id."""
    run_id, nul, proposal_id = key[len(ANSWER_CHANGELOG_PREFIX) :].partition(b"\x00")
    if not key.startswith(ANSWER_CHANGELOG_PREFIX) or not nul:
        raise ValueError(f"not an answer key: {key[:80]!r}")
    return run_id.decode(), proposal_id.decode()


def history_changelog_key(run_id: str, revision: int) -> bytes:
    return HISTORY_CHANGELOG_PREFIX + run_id.encode() + b"\x00" + struct.pack(">Q", revision)


def parse_history_changelog_key(key: bytes) -> tuple[str, int]:
    """(run id, revision) of a history key; ValueError when it is not one."""
    rest = key[len(HISTORY_CHANGELOG_PREFIX) :]
    if not key.startswith(HISTORY_CHANGELOG_PREFIX) or len(rest) < 10 or rest[-9:-8] != b"\x00":
        raise ValueError(f"not a history key: {key[:80]!r}")
    return rest[:-9].decode(), struct.unpack(">Q", rest[-8:])[0]


def is_run_key(key: bytes | None) -> bool:
    """Whether a changelog key is a run's (its snapshot). The other records there (fired
    marks, the Faust runtime's proposal ids) have keys that start with NUL, which no run
    id does (identifiers hold no control characters)."""
    return key is not None and key[:1] not in (b"", b"\x00")


def snapshot_index(snapshot: RunSnapshot) -> bytes:
    """The INDEX_HEADER value of a snapshot's changelog record: compact JSON, the bytes
    `json.dumps([machine, state, entered, [[due, revision, name], ...]],
    separators=(",", ":"))` writes, put together by hand (a commit writes one, and
    json.dumps took 3.6 us of it)."""
    timers = ",".join(
        f"[{t.due_at_ms:d},{t.revision:d},{_json_str(t.name)}]" for t in snapshot.timers
    )
    return (
        f"[{_json_str(snapshot.machine)},{_json_str(snapshot.state)},"
        f"{snapshot.entered_state_at_ms:d},[{timers}]]"
    ).encode()


#: A str as JSON, as json.dumps writes it (ASCII, escaped): the json module's C function.
_json_str = json.encoder.encode_basestring_ascii


def parse_index(raw: bytes) -> tuple[Where, TimerMarks]:
    """An INDEX_HEADER value back; ValueError when it is not one."""
    machine, state, entered, timers = json.loads(raw)
    if not (isinstance(machine, str) and isinstance(state, str) and isinstance(entered, int)):
        raise ValueError(f"not an index header: {raw[:80]!r}")
    return (machine, state, entered), [(int(d), int(r), str(n)) for d, r, n in timers]
