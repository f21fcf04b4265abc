"""A consumed batch admitted before any of it is decided, by either runtime: one pass of
the decoder and the verifier over the batch (`admit_record` says why), then the engine
record by record."""

import logging
import time
from dataclasses import dataclass

from confluent_kafka import Message

from processor.records.intake import Headers, TimestampType, Verified
from processor.records.pipeline import Admitted, DeadLetterReason, Outcome, Placement, admit_record
from processor.trust.keyring import Keyring

log = logging.getLogger("runstate.worker")


@dataclass(frozen=True, slots=True)
class Admission:
    """A record's admission (`admit_record`: a proposal to decide, or its outcome
    already) and the time it took, which the decision's histogram counts in."""

    admitted: Admitted | Outcome
    seconds: float


@dataclass(frozen=True, slots=True)
class Admitting:
    """What admitting a batch's records takes besides the records: the same for each."""

    keyring: Keyring
    partitions: int
    max_bytes: int
    verified: Verified

    def admit(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        timestamp_ms: int,
        timestamp_type: TimestampType,
    ) -> Admission:
        """One record admitted, or refused (a bug refuses it to the DLQ: one record must
        not stall its partition)."""
        began = time.perf_counter()
        try:
            admitted: Admitted | Outcome = admit_record(
                key,
                value,
                headers,
                timestamp_ms,
                topic=topic,
                keyring=self.keyring,
                placement=Placement(partition, self.partitions),
                max_bytes=self.max_bytes,
                verified=self.verified,
                timestamp_type=timestamp_type,
            )
        except Exception as exc:
            log.exception("admitting %s[%s]@%s failed", topic, partition, offset)
            admitted = DeadLetterReason(f"internal error while deciding: {exc!r}")
        return Admission(admitted, time.perf_counter() - began)


def admit_batch(batch: list[Message], admitting: Admitting) -> list[Admission | None]:
    """Every record of a consumer's batch admitted, or refused; None for a consumer
    error."""
    admissions: list[Admission | None] = []
    for msg in batch:
        if msg.error() is not None:
            admissions.append(None)
            continue
        timestamp_type, timestamp_ms = msg.timestamp()
        admissions.append(
            admitting.admit(
                msg.topic() or "",
                msg.partition() or 0,
                msg.offset() or 0,
                msg.key(),
                msg.value(),
                msg.headers(),
                timestamp_ms,
                TimestampType.of_librdkafka(timestamp_type),
            )
        )
    return admissions
