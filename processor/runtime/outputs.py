"""How outcomes are written to their topics (shared by the runtimes and the benchmark peers)."""

import base64
from dataclasses import dataclass

from processor.engine import Commit
from processor.pipeline import DeadLetterReason, Outcome
from processor.topics import TopicNames
from schemas.messages import DeadLetter


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode()


def dead_letter_value(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    reason: str,
    at_ms: int,
) -> bytes:
    """The DLQ record for a record: the reason, where it came from, and its exact bytes."""
    return (
        DeadLetter(
            error=reason,
            topic=topic,
            partition=partition,
            offset=offset,
            key_base64=_b64(key),
            value_base64=_b64(value),
            at_ms=at_ms,
        )
        .model_dump_json()
        .encode()
    )


@dataclass(frozen=True, slots=True)
class Source:
    """The proposals record an outcome answers."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class OutputRecord:
    topic: str
    key: bytes | None
    value: bytes


def outcome_records(topics: TopicNames, outcome: Outcome, source: Source) -> list[OutputRecord]:
    """The records an outcome is published as, in order: a commit's transition then its
    snapshot (changelog); a rejection; or the DLQ record of what could not be decoded."""
    if isinstance(outcome, Commit):
        run_key = outcome.snapshot.run_id.encode()
        return [
            OutputRecord(
                topics.transitions, run_key, outcome.transition.model_dump_json().encode()
            ),
            OutputRecord(topics.changelog, run_key, outcome.snapshot.model_dump_json().encode()),
        ]
    if isinstance(outcome, DeadLetterReason):
        value = dead_letter_value(
            source.topic,
            source.partition,
            source.offset,
            source.key,
            source.value,
            outcome.reason,
            source.timestamp_ms,
        )
        return [OutputRecord(topics.dlq, source.key, value)]
    key = outcome.run_id.encode() if outcome.run_id is not None else source.key
    return [OutputRecord(topics.rejections, key, outcome.model_dump_json().encode())]
