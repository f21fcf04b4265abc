"""One Kafka transaction of the worker as one object: what it consumed, what it staged
in the partition stores, what it observed for the metrics and what it will log.

`start_commit()` and `finish_commit()` run the documented order:
1. the outcomes were produced into the open transaction as they were decided;
2. the consumed offsets are added to the transaction (EOS v2: the group's metadata);
3. the transaction commits;
4. only then each partition's staged changes reach its store, in one WriteBatch (built
   on the loop's thread while steps 1-3 travel to the brokers in another) with
   the changelog offset they correspond to; then the metrics count
   the outcomes and the log shows them.
`abort()` aborts the transaction; the object is then dropped whole, and with it every
staged change. The worker starts a new transaction after either, so nothing about a
batch outlives it.
"""

import logging
import time
from typing import Any

from confluent_kafka import TopicPartition

from processor.kafka.topics import TopicNames
from processor.observe import traces
from processor.observe.logs import log_outcomes, logged
from processor.observe.metrics import MetricsBatch, WorkerMetrics
from processor.records.outputs import OutputRecord
from processor.records.pipeline import Outcome
from processor.runtimes.native.poison import Range
from processor.runtimes.native.producer import CommitInFlight, TransactionalProducer
from processor.runtimes.native.store.changes import PartitionTransaction, PreparedWrite
from processor.runtimes.native.store.partition import PartitionStore
from processor.runtimes.native.stores import StoreRegistry

log = logging.getLogger("runstate.worker")


class Transaction:
    def __init__(
        self,
        producer: TransactionalProducer,
        stores: StoreRegistry,
        topics: TopicNames,
        metrics: WorkerMetrics,
        after: "Transaction | None" = None,
    ) -> None:
        self.producer = producer
        self.topics = topics
        self.metrics = metrics
        self._stores = stores
        self.started = time.monotonic()
        #: partition -> first offset consumed and the next offset after the last.
        self._first: dict[int, int] = {}
        self._next: dict[int, int] = {}
        #: Records consumed plus timers fired: what makes a transaction due.
        self.records = 0
        self.observed = MetricsBatch()
        self._to_log: list[Outcome] = []
        self._partitions: dict[int, PartitionTransaction] = {}
        #: The previous transaction while its commit travels: this one decides over its
        #: changes and holds its own records until it is over (`base_committed`).
        self._after = after
        self._held: list[tuple[OutputRecord, int]] = []
        self._produced = False
        # While it commits: its stores' batches, built beside the commit, and the commit.
        self._prepared: dict[int, PreparedWrite] = {}
        self._in_flight: CommitInFlight | None = None
        self._began = 0.0
        #: The traced decisions' spans (`traces.decided`): each gets its commit's span.
        self.traced: list[Any] = []
        self._began_ns = 0

    @property
    def open(self) -> bool:
        """Whether it has anything to commit (a record produced or held)."""
        return self._produced

    @property
    def commit_done(self) -> bool:
        return self._in_flight is not None and self._in_flight.done

    def store(self, partition: int) -> PartitionTransaction | None:
        """The partition's store as this transaction sees it; None when not owned."""
        txn = self._partitions.get(partition)
        store = self._stores.get(partition)
        if txn is not None and txn.store is store:
            return txn
        # A store this transaction has not seen, or one opened again since: a transaction
        # over a closed store read it as empty (runs created twice after a partition
        # came back to the worker).
        assert txn is None or txn.empty, f"partition {partition}: its store changed mid-batch"
        if store is None:
            return None
        base = self._after.base(partition, store) if self._after is not None else None
        txn = self._partitions[partition] = store.begin(base)
        return txn

    def base(self, partition: int, store: PartitionStore) -> PartitionTransaction | None:
        """What the next transaction reads through for `partition`, while this one
        commits."""
        txn = self._partitions.get(partition)
        return txn if txn is not None and txn.store is store else None

    def release(self, partitions: list[int]) -> None:
        """Forget the partitions' stores (they are being closed). Only a transaction that
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
        if logged(outcome):
            self._to_log.append(outcome)

    def produce(self, record: OutputRecord, partition: int) -> None:
        """Into the transaction, to the partition number of the input (co-partitioned);
        held while the previous transaction commits."""
        self._produced = True
        if self._after is not None:
            self._held.append((record, partition))
            return
        self.producer.produce(record.topic, record.key, record.value, partition, record.headers)

    def base_committed(self) -> None:
        """The previous transaction committed and its changes reached the stores: read
        the stores again, and produce what was held (in the order decided)."""
        self._after = None
        for txn in self._partitions.values():
            txn.base_committed()
        held, self._held = self._held, []
        for record, partition in held:
            self.produce(record, partition)

    def ranges(self) -> dict[int, Range]:
        """partition -> (first offset, next offset) consumed in this transaction."""
        return {p: (first, self._next.get(p, first + 1)) for p, first in self._first.items()}

    def start_commit(self, group_metadata: object) -> None:
        """Steps 2 and 3 in another thread; meanwhile, the stores' batches are built here
        (the caller may go on deciding into the next transaction: see `base_committed`)."""
        assert self._after is None, "committed before the previous transaction"
        self._began = time.perf_counter()
        self._began_ns = time.time_ns()
        offsets = [
            TopicPartition(self.topics.proposals, p, offset) for p, offset in self._next.items()
        ]
        self._in_flight = self.producer.start_commit(offsets, group_metadata)
        for partition, txn in self._partitions.items():
            try:
                self._prepared[partition] = txn.prepare()
            except Exception:  # built again below, where its error counts
                log.exception("preparing the store batch of partition %s", partition)

    def finish_commit(self) -> dict[int, int]:
        """Wait for the commit; then, and only then, move the local stores (step 4)."""
        assert self._in_flight is not None
        in_flight, self._in_flight = self._in_flight, None
        in_flight.wait()  # raises KafkaException when it did not commit
        traces.committed(self.traced, self._began_ns)
        for partition, txn in self._partitions.items():
            offset = self.producer.next_offset(self.topics.changelog, partition)
            reached = {} if offset is None else {self.topics.changelog: offset}
            batch = self._prepared.get(partition)
            if batch is None:
                txn.flush(reached)
            else:
                batch.apply(reached)
        self.producer.forget()
        self.metrics.committed(self.observed, time.perf_counter() - self._began, self.records)
        log_outcomes(self._to_log)
        return dict(self._next)

    def abort(self) -> None:
        """Abort the transaction; nothing staged here reaches a store."""
        if self.producer.open:  # not when its records were all held
            self.producer.abort()
        self.metrics.aborted()
        traces.committed(self.traced, self._began_ns or time.time_ns(), error="aborted")
