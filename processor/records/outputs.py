"""How outcomes are written to their topics (shared by the runtimes and the benchmark peers).

Every record fits its topic: a DLQ or rejection record that would be larger than the
topic accepts is cut down (a prefix of the original bytes, with their length and
SHA-256; a detail cut short), so that no input, however large, can make the broker
refuse an outcome. A commit's records are bounded before that, by the pipeline's
`max_state_bytes` rule and by `CommitLimits` (what one commit writes to a topic fits one
batch of it), and the worker checks at start that its topics take them. The producer's
`batch.size` is kept to the smallest batch a topic it writes takes
(`RecordLimits.batch_size`), so that no batch of several records is refused either.
"""

import base64
import hashlib
import json
import logging
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from processor.engine import Beat, Commit, Forget, Relay
from processor.kafka.topics import TopicNames
from processor.records.pipeline import DeadLetterReason, Outcome
from schemas.messages import DeadLetter, Proposal, Rejection, RunSnapshot, Transition

log = logging.getLogger(__name__)

#: librdkafka's default `message.max.bytes`: the largest record a producer sends.
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
#: librdkafka's default `batch.size`: how many bytes of records it packs into one batch.
DEFAULT_BATCH_SIZE = 1_000_000
#: Room kept in a record for its headers and the record and batch framing.
RECORD_OVERHEAD = 1024
#: A record batch's bytes around its records (the v2 header is 61 bytes; the broker checks
#: the whole batch against `max.message.bytes`), rounded up.
BATCH_FRAMING = 128
#: A record's bytes around its key, value and headers, at most: its length, attributes,
#: timestamp and offset deltas, and the key, value and header-count lengths (varints).
RECORD_FRAMING = 40
#: A header's bytes around its name and value, at most (two varint lengths).
HEADER_FRAMING = 10
#: Longest record key an output keeps; a longer original key is left out (its bytes are
#: in the DLQ record).
MAX_OUTPUT_KEY_BYTES = 1024
MAX_ERROR_CHARS = 2048
#: Of a truncated DLQ record, at most this much of the original key is kept.
_KEY_PREFIX_BYTES = 256


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


@dataclass(frozen=True)
class RecordLimits:
    """The largest record value, key included, each output topic takes: the topic's
    `max.message.bytes` or the producer's `message.max.bytes`, whichever is smaller,
    less `RECORD_OVERHEAD`; and the most bytes of records, framing included, one batch of
    it holds (`batches`: that smaller limit less `BATCH_FRAMING`). Topics not named take
    the producer's default."""

    by_topic: Mapping[str, int] = field(default_factory=dict)
    default: int = DEFAULT_MESSAGE_MAX_BYTES - RECORD_OVERHEAD
    batches: Mapping[str, int] = field(default_factory=dict)
    default_batch: int = DEFAULT_MESSAGE_MAX_BYTES - BATCH_FRAMING

    def of(self, topic: str) -> int:
        return self.by_topic.get(topic, self.default)

    def batch(self, topic: str) -> int:
        """The bytes of records (`record_bytes`) one batch of `topic` holds at most."""
        return self.batches.get(topic, self.default_batch)

    def batch_size(self, configured: int = DEFAULT_BATCH_SIZE) -> int:
        """The producer's `batch.size`: the `configured` one, or less when a topic it
        writes takes smaller batches. The broker checks a whole batch against the topic's
        `max.message.bytes`, and a producer packs one partition's records into one batch
        up to `batch.size` (one record larger than that goes alone, and `of` bounds it)."""
        return max(1, min(configured, self.default_batch, *self.batches.values()))

    @classmethod
    def learn(cls, topics: Mapping[str, int], producer_max: int) -> "RecordLimits":
        """From each topic's `max.message.bytes` and the producer's `message.max.bytes`."""
        return cls(
            {topic: min(size, producer_max) - RECORD_OVERHEAD for topic, size in topics.items()},
            producer_max - RECORD_OVERHEAD,
            {topic: min(size, producer_max) - BATCH_FRAMING for topic, size in topics.items()},
            producer_max - BATCH_FRAMING,
        )


UNLIMITED = RecordLimits()


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode()


def clip(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def dead_letter_value(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    reason: str,
    at_ms: int,
    limit: int = UNLIMITED.default,
) -> bytes:
    """The DLQ record for a record: the reason, where it came from, its length and
    SHA-256, and its exact bytes, or as many of the first of them as fit in `limit`."""
    fields = dict(
        error=clip(reason, MAX_ERROR_CHARS),
        topic=topic,
        partition=partition,
        offset=offset,
        key_length=None if key is None else len(key),
        key_sha256=None if key is None else hashlib.sha256(key).hexdigest(),
        value_length=None if value is None else len(value),
        value_sha256=None if value is None else hashlib.sha256(value).hexdigest(),
        at_ms=at_ms,
    )
    full = _dead_letter(fields, key, value, truncated=False)
    if len(full) <= limit:
        return full
    bare = _dead_letter(fields, None if key is None else b"", None if value is None else b"", True)
    if len(bare) > limit:  # a topic this small keeps the reason's start and the hashes
        fields["error"] = clip(reason, max(64, MAX_ERROR_CHARS - (len(bare) - limit)))
        bare = _dead_letter(
            fields, b"" if key is not None else None, b"" if value is not None else None, True
        )
    room = max(0, limit - len(bare)) // 4 * 3  # raw bytes whose base64 fits
    key_part = None if key is None else key[: min(_KEY_PREFIX_BYTES, room // 2)]
    room -= 0 if key_part is None else -(-len(key_part) // 3) * 3
    value_part = None if value is None else value[: max(0, room)]
    return _dead_letter(fields, key_part, value_part, truncated=True)


def _dead_letter(
    fields: dict[str, object], key: bytes | None, value: bytes | None, truncated: bool
) -> bytes:
    letter = DeadLetter.model_validate(
        {**fields, "key_base64": _b64(key), "value_base64": _b64(value), "truncated": truncated}
    )
    return letter.model_dump_json().encode()


def rejection_value(rejection: Rejection, limit: int = UNLIMITED.default) -> bytes:
    """The rejection's JSON, made to fit `limit`: a large `step_result` is left out, then
    the detail is cut short, each saying so."""
    encoded = rejection.model_dump_json().encode()
    if len(encoded) <= limit:
        return encoded
    if rejection.step_result is not None:
        rejection = rejection.evolved(
            step_result=None,
            detail=f"{rejection.detail} (step_result left out: the rejection would be "
            f"{len(encoded)} bytes, over the topic's limit of {limit})",
        )
        encoded = rejection.model_dump_json().encode()
    detail = rejection.detail
    while len(encoded) > limit and detail:
        detail = detail[: max(0, len(detail) - (len(encoded) - limit) - 64)]
        shown = f"{detail}... (cut short to fit the topic)" if detail else "(left out to fit)"
        encoded = rejection.evolved(detail=shown).model_dump_json().encode()
    return encoded


def output_key(key: bytes | None) -> bytes | None:
    """An original record key as an output's key, unless it is too long to be one."""
    return key if key is None or len(key) <= MAX_OUTPUT_KEY_BYTES else None


@dataclass(frozen=True, slots=True)
class Source:
    """The proposals record an outcome answers."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


Headers = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True, slots=True)
class OutputRecord:
    topic: str
    key: bytes | None
    value: bytes | None  # None: a tombstone (compacted topics)
    headers: Headers | None = None
    #: Its partition, when not the input's (outputs are co-partitioned with it): a
    #: message to another run goes to that run's partition.
    partition: int | None = None


def record_bytes(key: bytes | None, value: bytes | None, headers: Headers | None) -> int:
    """A record's bytes in a batch, at most: key, value and headers with their framing."""
    size = RECORD_FRAMING + len(key or b"") + len(value or b"")
    for name, header in headers or ():
        raw = header.encode() if isinstance(header, str) else header or b""
        size += HEADER_FRAMING + len(name.encode()) + len(raw)
    return size


@dataclass(frozen=True, slots=True)
class Overflow:
    """A commit's records that one batch of their topic cannot hold."""

    topic: str
    records: int
    size: int  # their `record_bytes`, together
    limit: int  # what one batch of the topic holds


@dataclass(frozen=True)
class CommitLimits:
    """What one commit may write to each topic: its records there (the transition; the
    history record and the snapshot) together fit one batch of it, so no producer, however
    it packs them, sends a batch of them the broker refuses. Computed once from the
    topics' limits; `overflow` is pure."""

    topics: TopicNames
    limits: RecordLimits

    def overflow(self, commit: Commit, transition: bytes, snapshot: bytes) -> Overflow | None:
        """The first topic whose records of this commit (`transition` and `snapshot`: its
        JSON) one batch cannot hold; None when they fit."""
        sizes: dict[str, tuple[int, int]] = {}
        for record in commit_records(self.topics, commit, transition, snapshot):
            count, size = sizes.get(record.topic, (0, 0))
            sizes[record.topic] = (
                count + 1,
                size + record_bytes(record.key, record.value, record.headers),
            )
        for topic, (count, size) in sizes.items():
            limit = self.limits.batch(topic)
            if size > limit:
                return Overflow(topic, count, size, limit)
        return None


def commit_records(
    topics: TopicNames, commit: Commit, transition: bytes, snapshot: bytes
) -> list[OutputRecord]:
    """A commit's records: its transition, its history record and its snapshot
    (changelog), the run's snapshot last (see `outcome_records`)."""
    t = commit.transition
    run_key = commit.snapshot.run_id.encode()
    revision: Headers = [(REVISION_HEADER, revision_header(t))]
    return [
        OutputRecord(topics.transitions, run_key, transition, revision),
        OutputRecord(
            topics.changelog, history_changelog_key(t.run_id, t.revision), transition, revision
        ),
        OutputRecord(
            topics.changelog, run_key, snapshot, [(INDEX_HEADER, snapshot_index(commit.snapshot))]
        ),
    ]


def outcome_records(
    topics: TopicNames,
    outcome: Outcome,
    source: Source,
    limits: RecordLimits = UNLIMITED,
    answers: Sequence[bytes] = (),
    relay: Callable[[Proposal], OutputRecord] | None = None,
) -> list[OutputRecord]:
    """The records an outcome is published as, in order (the run's snapshot, or its
    tombstone, always last: a record after it would not be part of the outcome for a
    runtime that marks an outcome answered by its snapshot): a commit's transition,
    its history record and its snapshot (changelog); a heartbeat's answer then the
    run's snapshot, alive (changelog); a forgotten run's last transition, then
    tombstones (changelog); a rejection, and, when the run remembers it, its answer
    record (changelog); or the DLQ record of what could not be decoded. A message to
    another run (`Relay`, a commit's `sends`; before the snapshot) is the proposal
    `relay` signs. `answers`: the answer keys of a forgotten run (tombstoned with it)."""
    if isinstance(outcome, Relay):
        assert relay is not None, "a runtime that decides continuations signs their messages"
        refused = (
            []
            if outcome.refusal is None
            else outcome_records(topics, outcome.refusal, source, limits)
        )
        return [relay(outcome.proposal), *refused]
    if isinstance(outcome, Beat):
        run_key = outcome.snapshot.run_id.encode()
        return [
            OutputRecord(topics.heartbeats, run_key, outcome.heartbeat.model_dump_json().encode()),
            OutputRecord(
                topics.changelog,
                run_key,
                outcome.snapshot.model_dump_json().encode(),
                [(INDEX_HEADER, snapshot_index(outcome.snapshot))],
            ),
        ]
    if isinstance(outcome, Commit):
        transition, snapshot = outcome.encoded or (
            outcome.transition.model_dump_json().encode(),
            outcome.snapshot.model_dump_json().encode(),
        )
        records = commit_records(topics, outcome, transition, snapshot)
        if outcome.sends:
            assert relay is not None, "a runtime that decides continuations signs their messages"
            records[-1:-1] = [relay(proposal) for proposal in outcome.sends]
        return records
    if isinstance(outcome, Forget):
        t = outcome.transition
        run_key = t.run_id.encode()
        value = t.model_dump_json().encode()
        forgotten: Headers = [(REVISION_HEADER, revision_header(t))]
        # Tombstones: compaction then drops the run from the changelog, snapshot, fired
        # marks and history alike. The run's own last: a runtime that is at least once
        # (Faust) and dies half way decides the forget again, against the run still there.
        gone = [FIRED_CHANGELOG_PREFIX + run_key]
        gone += [history_changelog_key(t.run_id, r) for r in range(t.revision)]
        gone += answers
        gone.append(run_key)
        return [
            OutputRecord(topics.transitions, run_key, value, forgotten),
            *(OutputRecord(topics.changelog, key, None) for key in gone),
        ]
    if isinstance(outcome, DeadLetterReason):
        return [dead_letter_record(topics, source, outcome.reason, limits)]
    key = outcome.run_id.encode() if outcome.run_id is not None else output_key(source.key)
    limit = limits.of(topics.rejections) - len(key or b"")
    if outcome.content_digest is None or outcome.run_id is None:
        return [OutputRecord(topics.rejections, key, rejection_value(outcome, limit))]
    # The run's answer to this id for its life: in the changelog, as it was published
    # (so made to fit both topics).
    answer = answer_changelog_key(outcome.run_id, outcome.proposal_id or "")
    value = rejection_value(outcome, min(limit, limits.of(topics.changelog) - len(answer)))
    return [
        OutputRecord(topics.rejections, key, value),
        OutputRecord(topics.changelog, answer, value),
    ]


#: For a DLQ record that must fit whatever the broker takes: a few KB of the record's bytes.
SMALL = RecordLimits(default=8 * 1024)


def publishable(
    topics: TopicNames,
    outcome: Outcome,
    source: Source,
    limits: RecordLimits = UNLIMITED,
    answers: Sequence[bytes] = (),
    relay: Callable[[Proposal], OutputRecord] | None = None,
) -> tuple[Outcome, list[OutputRecord]]:
    """The outcome and its records (`outcome_records`); an outcome that cannot be encoded
    (a bug) becomes a small DLQ record naming why, so that one record never stalls its
    partition."""
    try:
        return outcome, outcome_records(topics, outcome, source, limits, answers, relay)
    except Exception as exc:
        log.exception("publishing %s[%s]@%s failed", source.topic, source.partition, source.offset)
        failed = DeadLetterReason(f"internal error while encoding its outcome: {exc!r}")
        return failed, [dead_letter_record(topics, source, failed.reason, SMALL)]


def dead_letter_record(
    topics: TopicNames, source: Source, reason: str, limits: RecordLimits = UNLIMITED
) -> OutputRecord:
    key = output_key(source.key)
    value = dead_letter_value(
        source.topic,
        source.partition,
        source.offset,
        source.key,
        source.value,
        reason,
        source.timestamp_ms,
        limits.of(topics.dlq) - len(key or b""),
    )
    return OutputRecord(topics.dlq, key, value)
