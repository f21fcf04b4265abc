"""One Kafka transaction of the worker as one object: what it consumed, what it staged
in the partition stores, what it observed for the metrics and what it will log.

`commit()` runs the documented order:
1. the outcomes were produced into the open transaction as they were decided;
2. the consumed offsets are added to the transaction (EOS v2: the group's metadata);
3. the transaction commits;
4. only then each partition's staged changes reach its store, in one WriteBatch with
   the changelog offset they correspond to; then the metrics count
   the outcomes and the log shows them.
`abort()` aborts the transaction; the object is then dropped whole, and with it every
staged change. The worker starts a new checkpoint after either, so nothing about a
batch outlives it.
"""

import logging
import time

from confluent_kafka import TopicPartition

from processor.logs import OUTCOMES_LOG, log_outcomes
from processor.metrics import MetricsBatch, WorkerMetrics
from processor.outputs import OutputRecord
from processor.pipeline import Outcome
from processor.runtime.poison import Range
from processor.runtime.producer import TransactionalProducer
from processor.runtime.store import PartitionTransaction
from processor.runtime.stores import StoreRegistry
from processor.topics import TopicNames


class Checkpoint:
    def __init__(
        self,
        producer: TransactionalProducer,
        stores: StoreRegistry,
        topics: TopicNames,
        metrics: WorkerMetrics,
    ) -> None:
        self.producer = producer
        self.topics = topics
        self.metrics = metrics
        self._stores = stores
        self.started = time.monotonic()
        #: partition -> first offset consumed and the next offset after the last.
        self._first: dict[int, int] = {}
        self._next: dict[int, int] = {}
        #: Records consumed plus timers fired: what makes a checkpoint due.
        self.records = 0
        self.observed = MetricsBatch()
        self._to_log: list[Outcome] = []
        self._partitions: dict[int, PartitionTransaction] = {}

    @property
    def open(self) -> bool:
        return self.producer.open

    def store(self, partition: int) -> PartitionTransaction | None:
        """The partition's store as this transaction sees it; None when not owned."""
        txn = self._partitions.get(partition)
        store = self._stores.get(partition)
        if txn is not None and txn.store is store:
            return txn
        # A store this checkpoint has not seen, or one opened again since: a transaction
        # over a closed store read it as empty (runs created twice after a partition
        # came back to the worker).
        assert txn is None or txn.empty, f"partition {partition}: its store changed mid-batch"
        if store is None:
            return None
        txn = self._partitions[partition] = store.begin()
        return txn

    def release(self, partitions: list[int]) -> None:
        """Forget the partitions' stores (they are being closed). Only a checkpoint that
        holds nothing for them may: the worker commits or aborts before letting go."""
        for partition in partitions:
            txn = self._partitions.pop(partition, None)
            assert txn is None or txn.empty, f"partition {partition} released with changes"

    def consumed(self, partition: int, offset: int) -> None:
        self._first.setdefault(partition, offset)
        self._next[partition] = offset + 1
        self.records += 1

    def decided(self, outcome: Outcome) -> None:
        """An outcome, logged once the transaction committed (not if it aborts)."""
        if OUTCOMES_LOG.isEnabledFor(logging.WARNING):
            self._to_log.append(outcome)

    def produce(self, record: OutputRecord, partition: int) -> None:
        """Into the transaction, to the partition number of the input (co-partitioned)."""
        self.producer.produce(record.topic, record.key, record.value, partition, record.headers)

    def ranges(self) -> dict[int, Range]:
        """partition -> (first offset, next offset) consumed in this transaction."""
        return {p: (first, self._next.get(p, first + 1)) for p, first in self._first.items()}

    def commit(self, group_metadata: object) -> dict[int, int]:
        """Commit, then move the stores (see the module doc). Returns the partitions'
        committed next offsets. Raises KafkaException: abort then."""
        began = time.perf_counter()
        offsets = [
            TopicPartition(self.topics.proposals, p, offset) for p, offset in self._next.items()
        ]
        self.producer.commit(offsets, group_metadata)
        # The transaction is durable: now, and only now, move the local stores.
        for partition, txn in self._partitions.items():
            offset = self.producer.next_offset(self.topics.changelog, partition)
            txn.flush({} if offset is None else {self.topics.changelog: offset})
        self.producer.forget()
        self.metrics.committed(self.observed, time.perf_counter() - began, self.records)
        log_outcomes(self._to_log)
        return dict(self._next)

    def abort(self) -> None:
        """Abort the transaction; nothing staged here reaches a store."""
        self.producer.abort()
        self.metrics.aborted()
