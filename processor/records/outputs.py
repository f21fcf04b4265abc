"""How outcomes are written to their topics (shared by the runtimes and the benchmark peers).

Every record fits its topic: a DLQ or rejection record that would be larger than the
topic accepts is cut down (a prefix of the original bytes, with their length and
SHA-256; a detail cut short), so that no input, however large, can make the broker
refuse an outcome. A commit's records are bounded before that, by the pipeline's
`max_state_bytes` rule and by `CommitLimits` (what one commit writes to a topic fits one
batch of it), and the worker checks at start that its topics take them.
"""

import base64
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from processor.engine import Beat, Commit, Forget, Relay
from processor.kafka.topics import TopicNames
from processor.records.changelog_keys import (
    FIRED_CHANGELOG_PREFIX,
    HISTORY_CHANGELOG_PREFIX,
    INDEX_HEADER,
    REVISION_HEADER,
    answer_changelog_key,
    history_changelog_key,
    revision_header,
    snapshot_index,
)
from processor.records.limits import HEADER_FRAMING, RECORD_FRAMING, UNLIMITED, RecordLimits
from processor.records.pipeline import DeadLetterReason, Outcome
from schemas.identifiers import MAX_PROPOSAL_ID_BYTES, MAX_RUN_ID_BYTES
from schemas.messages import DeadLetter, Proposal, Rejection

log = logging.getLogger(__name__)

#: Longest record key an output keeps; a longer original key is left out (its bytes are
#: in the DLQ record).
MAX_OUTPUT_KEY_BYTES = 1024
MAX_ERROR_CHARS = 2048
#: Of a truncated DLQ record, at most this much of the original key is kept.
_KEY_PREFIX_BYTES = 256


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


class Source(NamedTuple):
    """The proposals record an outcome answers. (A named tuple, as `OutputRecord`: one
    is made per record, and a frozen dataclass took about four times as long.)"""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


Headers = list[tuple[str, str | bytes | None]]


class OutputRecord(NamedTuple):
    """One record an outcome is published as. A named tuple: a commit makes three and
    more, and a frozen dataclass took about four times as long to build (1 µs)."""

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

    #: The smaller batch of the two topics a commit writes.
    smallest: int = field(init=False)

    def __post_init__(self) -> None:
        batch = self.limits.batch
        object.__setattr__(
            self, "smallest", min(batch(self.topics.transitions), batch(self.topics.changelog))
        )

    def overflow(self, commit: Commit, transition: bytes, snapshot: bytes) -> Overflow | None:
        """The first topic whose records of this commit (`transition` and `snapshot`: its
        JSON) one batch cannot hold; None when they fit."""
        # Most commits are far below any batch: an upper bound on all three records
        # together settles them without building the records (that took a tenth of
        # deciding a commit). The snapshot's index header is at most three times the
        # snapshot's JSON (it repeats a few of its fields, a character escaped to at most
        # three times its UTF-8 bytes); keys and the revision header are bounded by the
        # run id's and proposal id's largest sizes.
        if 2 * len(transition) + 4 * len(snapshot) + _COMMIT_FRAMING <= self.smallest:
            return None
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


#: What a commit's three records hold besides their values and the snapshot's index, at
#: most: framing, three keys (the history key is the run's with a prefix and revision),
#: and the two revision headers (a revision of 20 digits, a space, a proposal id) and the
#: index header's name.
_COMMIT_FRAMING = (
    3 * RECORD_FRAMING
    + 3 * (MAX_RUN_ID_BYTES + len(HISTORY_CHANGELOG_PREFIX) + 9)
    + 3 * HEADER_FRAMING
    + 2 * (len(REVISION_HEADER) + 21 + MAX_PROPOSAL_ID_BYTES)
    + len(INDEX_HEADER)
)


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
