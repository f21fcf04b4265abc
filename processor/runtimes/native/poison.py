"""Records whose outcome the broker keeps refusing: found and set aside, never retried forever.

Outputs are bounded to what each topic takes (see `outputs`), but a topic's limit can be
lowered under a running worker, and brokers refuse records for reasons of their own.
Such a refusal aborts the whole transaction. The worker then reads the topics' limits
again, and when they changed decides the batch again within them; a refusal they do not
explain would be repeated, forever, stalling every partition of the worker. So:

1. a batch aborted `attempts` times for a refused record, starting at the same offsets,
   puts its partitions in *isolation* up to where the batch reached: each of those
   records is then decided and committed in a transaction of its own;
2. a record whose own transaction is refused `attempts` times is *poisoned*: next time
   its outcome is replaced by a DLQ record naming the broker's reason, and the run's
   state stays as it was.

Only errors that a record causes count (`is_record_error`): a broker that is down or
restarting aborts transactions too, and those are retried as long as it takes.
"""

from collections import Counter
from collections.abc import Mapping

from confluent_kafka import KafkaError

#: Broker and client errors that refuse a record for what it is (size, format), as
#: opposed to the state of the cluster.
RECORD_ERRORS = frozenset(
    {
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError._BAD_MSG,
        KafkaError._INVALID_ARG,
    }
)

#: A partition's input range in one transaction: (first offset, next offset after the last).
Range = tuple[int, int]


def is_record_error(error: KafkaError | None) -> bool:
    return error is not None and error.code() in RECORD_ERRORS


class Quarantine:
    """Counts refused transactions by the offsets they started at (see module doc)."""

    def __init__(self, attempts: int = 2) -> None:
        self.attempts = attempts
        self._batch_refusals: Counter[frozenset[tuple[int, int]]] = Counter()
        self._record_refusals: Counter[tuple[int, int]] = Counter()
        self._isolated: dict[int, int] = {}  # partition -> isolate offsets below this
        self._poisoned: dict[tuple[int, int], str] = {}

    def refused(self, batch: Mapping[int, Range], why: str) -> None:
        """A transaction holding `batch` (partition -> range) was aborted because the
        broker refused a record of it."""
        if not batch:
            return
        if len(batch) == 1:
            ((partition, (first, end)),) = batch.items()
            if end - first == 1 and self.isolating(partition, first):
                self._record_refusals[(partition, first)] += 1
                if self._record_refusals[(partition, first)] >= self.attempts:
                    self._poisoned[(partition, first)] = why
                return
        key = frozenset((p, first) for p, (first, _) in batch.items())
        self._batch_refusals[key] += 1
        if self._batch_refusals[key] >= self.attempts:
            for partition, (_, end) in batch.items():
                self._isolated[partition] = max(end, self._isolated.get(partition, end))

    def isolating(self, partition: int, offset: int) -> bool:
        """Whether the record at `offset` must be committed in a transaction of its own."""
        return offset < self._isolated.get(partition, -1)

    @property
    def active(self) -> bool:
        return bool(self._isolated)

    def poisoned(self, partition: int, offset: int) -> str | None:
        """Why the record's outcome cannot be published, if it cannot."""
        return self._poisoned.get((partition, offset))

    def committed(self, partition: int, next_offset: int) -> None:
        """The partition's input is committed up to `next_offset`: forget what is behind."""
        if self._isolated.get(partition, next_offset + 1) <= next_offset:
            del self._isolated[partition]
        for mark in [m for m in self._poisoned if m[0] == partition and m[1] < next_offset]:
            del self._poisoned[mark]
        for mark in [m for m in self._record_refusals if m[0] == partition and m[1] < next_offset]:
            del self._record_refusals[mark]
        for key in [k for k in self._batch_refusals if any(p == partition for p, _ in k)]:
            if any(p == partition and first < next_offset for p, first in key):
                del self._batch_refusals[key]
