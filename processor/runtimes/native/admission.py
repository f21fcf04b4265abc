"""A consumed batch admitted before any of it is decided: one pass of the decoder and
the verifier over the batch (`admit_record` says why), then the engine record by record."""

import logging
import time
from dataclasses import dataclass

from confluent_kafka import Message

from processor.records.intake import TimestampType, Verified
from processor.records.pipeline import Admitted, DeadLetterReason, Outcome, Placement, admit_record
from processor.trust.keyring import Keyring

log = logging.getLogger("runstate.worker")


@dataclass(frozen=True, slots=True)
class Admission:
    """A record's admission (`admit_record`: a proposal to decide, or its outcome
    already) and the time it took, which the decision's histogram counts in."""

    admitted: Admitted | Outcome
    seconds: float


def admit_batch(
    batch: list[Message], verified: Verified, keyring: Keyring, partitions: int, max_bytes: int
) -> list[Admission | None]:
    """Every record of the batch admitted, or refused; None for a consumer error."""
    admissions: list[Admission | None] = []
    clock = time.perf_counter
    for msg in batch:
        if msg.error() is not None:
            admissions.append(None)
            continue
        began = clock()
        try:
            timestamp_type, timestamp_ms = msg.timestamp()
            admitted: Admitted | Outcome = admit_record(
                msg.key(),
                msg.value(),
                msg.headers(),
                timestamp_ms,
                topic=msg.topic() or "",
                keyring=keyring,
                placement=Placement(msg.partition() or 0, partitions),
                max_bytes=max_bytes,
                verified=verified,
                timestamp_type=TimestampType.of_librdkafka(timestamp_type),
            )
        except Exception as exc:  # a bug must not turn one record into a stalled partition
            log.exception("admitting %s[%s]@%s failed", msg.topic(), msg.partition(), msg.offset())
            admitted = DeadLetterReason(f"internal error while deciding: {exc!r}")
        admissions.append(Admission(admitted, clock() - began))
    return admissions
