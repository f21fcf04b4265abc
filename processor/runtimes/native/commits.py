"""The native worker's commit pipeline: one object owns the transactional producer, the
open `Transaction`, the one whose commit travels, and the read fence around it.

One commit travels at a time while the next transaction decides over its changes
(`start_commit`, then `finish_commit` at a later turn). Any failure aborts both unapplied
(`abort`), unless the travelling commit went through after all, and rewinds the input to
the committed offsets, so nothing is half-applied. A producer whose call hung is
replaced by one of the same transactional id, whose init fences the old
(`replace_producer`); one that may hold a dead coordinator is swapped between
transactions (`fresh_producer`).
"""

import logging
import threading
import time
from typing import Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from processor.observe.metrics import WorkerMetrics
from processor.records.limits import DEFAULT_BATCH_SIZE, UNLIMITED, RecordLimits
from processor.records.outputs import CommitLimits
from processor.runtimes.errors import ClientBroken, ClientHung
from processor.runtimes.native.poison import Quarantine, is_record_error
from processor.runtimes.native.preflight import batch_size, learn_limits
from processor.runtimes.native.producer import TransactionalProducer
from processor.runtimes.native.stores import StoreRegistry
from processor.runtimes.native.transaction import Transaction
from processor.runtimes.settings import WorkerConfig
from processor.serving.read_fence import ReadFence

log = logging.getLogger("runstate.worker")

#: How long a rewind waits for the committed offsets (a group coordinator moving after a
#: broker died takes seconds), asking with this timeout each time.
REWIND_PATIENCE_S = 20.0
REWIND_CALL_S = 5.0
# How long reading the topics' limits again, after the broker refused a record for its
# size, may take (seconds); the loop waits for it.
RELEARN_TIMEOUT_S = 10.0


class CommitPipeline:
    """The producer, the open transaction and the commit in flight, with what they need
    to commit and to undo: the worker's stores, its quarantine and its counts. `consumer`
    is set once the worker has one (its group metadata goes into each commit; an abort
    rewinds it)."""

    def __init__(
        self,
        config: WorkerConfig,
        producer_id: str,
        stores: StoreRegistry,
        quarantine: Quarantine,
        metrics: WorkerMetrics,
        counts: "Counts",
    ) -> None:
        self.config = config
        self.topics = config.topics
        self.producer_id = producer_id
        self.stores = stores
        self.quarantine = quarantine
        self.metrics = metrics
        self.counts = counts
        self.consumer: Consumer | None = None
        # What each output topic takes (learned at start, and again when the broker
        # refuses a record for its size), and so what one commit may write.
        self.limits: RecordLimits = UNLIMITED
        self.commit_limits = CommitLimits(config.topics, UNLIMITED)
        # Kept until the process ends, also when broken (see producer.py).
        self.producer: TransactionalProducer | None = None
        #: The group lost its coordinator (partitions lost): the producer may have cached
        #: the dead one, and its next send_offsets_to_transaction would block on it.
        self.stale_coordinator = False
        self.transaction: Transaction | None = None
        # The previous transaction while its commit travels; `transaction` decides meanwhile.
        self.committing: Transaction | None = None
        # HTTP reads wait for the commit in flight to reach the stores (read_fence.py).
        self.read_fence = ReadFence()
        self._fenced: int | None = None

    def start(self, limits: RecordLimits) -> None:
        """The topics' limits as the worker found them, a producer and a transaction."""
        self.limits, self.commit_limits = limits, CommitLimits(self.topics, limits)
        self.producer = self.new_producer()
        self.transaction = self.new_transaction()

    def new_producer(self) -> TransactionalProducer:
        """The transactional producer, its id's previous transaction ended (fenced)."""
        producer = TransactionalProducer(
            self.config.kafka,
            self.producer_id,
            self.config.settings.transaction_timeout_ms,
            batch_size(self.config.kafka, self.limits, DEFAULT_BATCH_SIZE),
        )
        producer.init()
        return producer

    def new_transaction(self, after: Transaction | None = None) -> Transaction:
        assert self.producer is not None
        return Transaction(self.producer, self.stores, self.topics, self.metrics, after)

    @property
    def open(self) -> bool:
        """A transaction holds something, or a commit travels."""
        transaction = self.transaction
        return self.committing is not None or (transaction is not None and transaction.open)

    # -- committing ------------------------------------------------------------
    def commit(self) -> None:
        """Commit the open transaction, if any, and start the next; wait for both."""
        self.start_commit()
        self.finish_commit()

    def start_commit(self) -> None:
        """Start the open transaction's commit, after the one in flight (if any) is over;
        the next transaction decides meanwhile, over its changes."""
        if not self.finish_commit():
            return
        transaction = self.transaction
        if transaction is None or not transaction.open:
            return
        assert self.consumer is not None
        self.unfence()  # (finished above: none is open; a leaked one would stall reads)
        self._fenced = self.read_fence.open()  # before its outcomes can be seen
        transaction.start_commit(self.consumer.consumer_group_metadata())
        self.committing = transaction
        self.transaction = self.new_transaction(after=transaction)

    def finish_commit(self) -> bool:
        """Wait for the commit in flight, if any, and finish it: the stores move, and the
        open transaction produces what it held. False when it failed (then aborted)."""
        committing, self.committing = self.committing, None
        if committing is None:
            return True
        try:
            committed = committing.finish_commit()
        except KafkaException as exc:
            self.abort(f"transaction failed: {exc}", exc.args[0], failed=committing)
            return False
        self._committed(committed)
        self.unfence()
        transaction = self.transaction
        assert transaction is not None
        transaction.base_committed()
        return True

    def unfence(self) -> None:
        """The commit in flight is over: its changes are in the stores, or nowhere."""
        fenced, self._fenced = self._fenced, None
        if fenced is not None:
            self.read_fence.close(fenced)

    def _committed(self, committed: dict[int, int]) -> None:
        for partition, next_offset in committed.items():
            self.quarantine.committed(partition, next_offset)
        self.counts.transactions += 1

    # -- undoing ---------------------------------------------------------------
    def abort(
        self, why: str, error: KafkaError | None = None, failed: Transaction | None = None
    ) -> None:
        """Drop the open transaction whole, and the one committing (unless its commit
        went through: then its changes reach the stores first); rewind to the committed
        offsets. `failed`: the transaction whose commit failed (already out of flight)."""
        # ERROR when state cannot be persisted; nothing of the batch applies.
        log.error("state not persisted, transaction aborted (%s); deciding again", why)
        transaction = self.transaction
        assert transaction is not None
        committing, self.committing = self.committing, None
        # First: whatever fails below (a hung call gives up on the producer), nothing
        # staged in either transaction may reach a store.
        self.transaction = self.new_transaction()
        if failed is None:
            failed = transaction
            if committing is not None:
                try:  # committed after all: durable, so its changes must reach the stores
                    self._committed(committing.finish_commit())
                except KafkaException as exc:  # its transaction is the one to abort
                    log.debug("the commit in flight did not go through: %s", exc)
                    failed = committing
        # A record refused for its size under limits learned since: the batch is decided
        # again within them (a commit over them refused state_too_large, a rejection or
        # DLQ record cut to fit). Otherwise the refusal counts towards isolation.
        relearned = is_record_error(error) and self._relearn_limits()
        if is_record_error(error) and not relearned:
            self.quarantine.refused(failed.ranges(), why)
        failed.abort()
        if relearned:
            self.swap_producer()  # between transactions; its batch.size from the limits
        self.unfence()
        if self.consumer is not None:
            rewind(self.consumer, self.topics.proposals, self.stores.owned())
        self.counts.aborts += 1

    def _relearn_limits(self) -> bool:
        """Read the topics' limits again (a topic's max.message.bytes lowered under the
        running worker); True when they changed, and the worker now keeps to them."""
        try:
            limits = learn_limits(
                AdminClient(self.config.kafka.client()),
                self.config.kafka,
                self.topics,
                RELEARN_TIMEOUT_S,
            )
        except KafkaException as exc:
            log.warning("the topics' limits could not be read again: %s", exc)
            return False
        if limits == self.limits:
            return False
        changed = sorted(
            topic
            for topic in {*limits.batches, *self.limits.batches}
            if limits.batch(topic) != self.limits.batch(topic)
        )
        log.warning(
            "topics %s take other batches than the worker knew (now, bytes of records: %s); "
            "deciding again within them",
            ", ".join(changed),
            ", ".join(f"{topic} {limits.batch(topic)}" for topic in changed),
        )
        self.limits = limits
        self.commit_limits = CommitLimits(self.topics, limits)
        return True

    # -- producers -------------------------------------------------------------
    def replace_producer(self, why: ClientBroken) -> None:
        """Go on with a new producer of the same transactional id after a call of the
        old one hung (librdkafka can block for good when a coordinator moves): the new
        one's init fences the old and ends its transaction, committed or aborted, which
        nobody here can know. So both open transactions are dropped unapplied; the
        caller has the owned stores catch up from the changelog, then `unfence`s."""
        log.error("%s; replacing the producer (the new one fences the old)", why)
        assert self.producer is not None
        self.committing = None
        self.counts.aborts += 1
        self.metrics.aborted()
        old = self.producer
        self.producer = self.new_producer()  # ClientBroken if it cannot: restart in place
        # Only now, fenced by the new one's init, may the old one be closed.
        old.retire(why.returned if isinstance(why, ClientHung) else None)
        self.stale_coordinator = False
        self.transaction = self.new_transaction()

    def fresh_producer(self) -> None:
        """After the group lost its coordinator, and once partitions came back (the
        brokers answer again), a new producer between transactions: librdkafka can keep
        the dead coordinator cached and block the next send_offsets_to_transaction on it
        (librdkafka issue 5511), seen after every coordinator kill; a fresh one looks it
        up. The old one holds no transaction; it is closed in a thread of its own, in case
        it blocks."""
        transaction = self.transaction
        if self.committing is not None or transaction is None or transaction.open:
            return  # at the next turn without a transaction
        self.stale_coordinator = False
        self.swap_producer()
        log.info("the group's coordinator moved: a new producer, with no stale coordinator")

    def swap_producer(self) -> None:
        """A new producer, with the worker's settings as they are, while no transaction is
        open; the old one, holding none, is closed in a thread of its own (it may block)."""
        assert self.producer is not None
        old, self.producer = self.producer, self.new_producer()
        self.transaction = self.new_transaction()
        threading.Thread(target=old.close, name="runstate-old-producer", daemon=True).start()

    def close(self) -> None:
        """Abort what is open and close the producer (a worker that is not broken)."""
        if self.producer is not None:
            if self.producer.open or self.committing is not None:
                self.abort("shutting down with an open transaction")
            self.producer.close()
        self.unfence()


class Counts(Protocol):
    """What the pipeline counts (the worker's `WorkerStats`)."""

    transactions: int
    aborts: int


def rewind(consumer: Consumer, topic: str, partitions: list[int]) -> list[int]:
    """Seek `partitions` back to their committed offsets (what an aborted transaction
    consumed is decided again). Asking for them waits out a moving group coordinator
    (NOT_COORDINATOR, seen when a broker is killed or paused); when it does not come
    back, ClientBroken: going on from where the consumer stands would skip what the
    abort undid, so the partitions wait for a new producer's catch-up instead.

    Returns the partitions the consumer is not fetching yet (their seek was refused,
    _STATE: the committed offset applies when their fetch starts)."""
    if not partitions:
        return []
    wanted = [TopicPartition(topic, p) for p in partitions]
    deadline = time.monotonic() + REWIND_PATIENCE_S
    while True:
        try:
            committed = consumer.committed(wanted, timeout=REWIND_CALL_S)
            failed = [tp for tp in committed if tp.error is not None]
            problem = str(failed[0].error) if failed else None
        except KafkaException as exc:
            if exc.args[0].fatal():
                raise ClientBroken(f"the consumer failed: {exc}") from exc
            problem = str(exc)
        if problem is None:
            break
        if time.monotonic() >= deadline:
            raise ClientBroken(
                f"the committed offsets of partitions {partitions} could not be read for "
                f"{REWIND_PATIENCE_S:.0f} s ({problem})"
            )
        log.warning("reading the committed offsets of %s: %s; again", partitions, problem)
        time.sleep(0.5)
    not_fetching = []
    for tp in committed:
        offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
        try:
            consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        except KafkaException as exc:  # not yet fetching: the committed offset applies
            log.debug("seek %s: %s", tp, exc)
            not_fetching.append(tp.partition)
    return not_fetching
