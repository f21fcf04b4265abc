"""The native worker: proposals in, transitions/rejections/DLQ out, exactly once.

The loop and the rebalance wiring; each job is a part of its own:
- `Transaction` (transaction.py): one Kafka transaction, from the first record consumed
  to the commit that moves the stores (its module says the order);
- `TransactionalProducer` (producer.py): begin, produce, send offsets, commit, abort,
  with librdkafka's known hangs bounded;
- `StoreRegistry` / `PartitionStore` (stores.py, store.py): the owned partitions' state;
- `Punctuator` (processor/records/punctuator.py, shared with the Faust runtime): due timers
  as records;
- `Quarantine` (poison.py): records whose outcome the broker keeps refusing;
- `check_topics` (preflight.py): the topics fit the worker, and what records they take;
- `WorkerQueries` (queries.py): what the HTTP API (processor/serving/api.py) asks of it;
- `admit_record`, `decide_admitted` (pipeline.py): the decision, pure, in two steps: a
  turn admits its whole batch first, then decides it record by record.
When the input has nothing more for now, and at the latest every 100 ms (or N
records), the open transaction commits; on any failure it is
aborted, and the consumer rewound to the committed offsets: nothing is half-applied.
"""

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from processor.engine import Beat, Commit, Forget, is_finished
from processor.kafka.config import WorkerConfig
from processor.observe.metrics import WorkerMetrics
from processor.records.intake import TimestampType, Verified
from processor.records.outputs import (
    DEFAULT_BATCH_SIZE,
    SMALL,
    UNLIMITED,
    CommitLimits,
    OutputRecord,
    RecordLimits,
    Source,
    publishable,
)
from processor.records.pipeline import (
    Admitted,
    DeadLetterReason,
    Outcome,
    Placement,
    admit_record,
    decide_admitted,
    outcome_run_id,
)
from processor.records.punctuator import Punctuator, timer_key
from processor.records.stats import OutcomeStats
from processor.runtimes import identity
from processor.runtimes.errors import ClientBroken, ClientHung, WorkerError
from processor.runtimes.native.heap import IdleTrim
from processor.runtimes.native.poison import Quarantine, is_record_error
from processor.runtimes.native.preflight import batch_size, check_topics, learn_limits
from processor.runtimes.native.producer import TransactionalProducer
from processor.runtimes.native.restore import RestoreJob
from processor.runtimes.native.snapshot_cache import SNAPSHOTS
from processor.runtimes.native.statedir import StateDir, StateDirBusy
from processor.runtimes.native.store.changes import PartitionTransaction
from processor.runtimes.native.store.partition import PartitionStore
from processor.runtimes.native.stores import StoreRegistry
from processor.runtimes.native.transaction import Transaction
from processor.runtimes.native.verifier import BatchVerifier
from processor.serving.peers import client_id
from processor.serving.read_fence import ReadFence
from processor.trust.keyring import KeyringWatch
from schemas.messages import Proposal, Rejection, RunSnapshot

log = logging.getLogger("runstate.worker")

LAG_INTERVAL_S = 1.0
#: How long a rewind waits for the committed offsets (a group coordinator moving after a
#: broker died takes seconds), asking with this timeout each time.
REWIND_PATIENCE_S = 20.0
REWIND_CALL_S = 5.0
# Records taken from the consumer per turn of the loop at most. A turn waits for the
# first of them only (`_take`): librdkafka's batch call waits its whole timeout to fill
# the batch, and with a 20 ms wait that was ~20 ms of every answer at a trickle.
CONSUME_BATCH = 500
# How long an idle turn waits for a first record (timers and lag are looked at between).
CONSUME_WAIT_S = 0.02
# How long a turn waits while a commit travels: its end is seen at the next turn, and the
# records held for it are produced then (the worker cannot be woken by the commit).
COMMITTING_WAIT_S = 0.002
# Proposal bytes librdkafka may prefetch ahead of the loop (its default: 64 MB). Under a
# backlog it fetched that much, and its fetch thread's malloc arena kept the 64 MB
# after the backlog was drained (of 114 MB freed but kept by a worker that had taken
# 1,000,000 runs). 8 MB is still some 30,000 of the benchmark's proposals, seconds of work.
CONSUME_QUEUE_KBYTES = 8 * 1024
# How long reading the topics' limits again, after the broker refused a record for its
# size, may take (seconds); the loop waits for it.
RELEARN_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Admission:
    """A record's admission (`admit_record`: a proposal to decide, or its outcome
    already) and the time it took, which the decision's histogram counts in."""

    admitted: Admitted | Outcome
    seconds: float


@dataclass
class WorkerStats(OutcomeStats):
    transactions: int = 0
    aborts: int = 0
    restored_records: int = 0


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.topics = config.topics
        self.stats = WorkerStats()
        self.stores = StoreRegistry()  # HTTP threads read them under its lock
        self.partitions = 0
        # The URL other workers reach this one's HTTP API at (set before start()): it
        # goes into the consumer's client.id, where cluster queries find it.
        self.advertised_url: str | None = None
        self._stop = threading.Event()
        # Records whose outcome the broker keeps refusing (poison.py).
        self.quarantine = Quarantine()
        # What each output topic takes (learned at start, and again when the broker
        # refuses a record for its size), and so what one commit may write.
        self.limits: RecordLimits = UNLIMITED
        self.commit_limits = CommitLimits(config.topics, UNLIMITED)
        self._lag: dict[int, int] = {}
        self._last_lag = 0.0
        self.metrics = WorkerMetrics(
            config.machines,
            lambda: self.stores.runs_by_state(config.machines),
            lambda: dict(self._lag),
            lambda: self.stores.memory(),
            lambda: len(SNAPSHOTS),
        )
        try:
            self.state_dir = StateDir(
                config.state_dir, config.group_id, config.topics.proposals
            ).claim()
        except StateDirBusy as exc:
            raise WorkerError(str(exc)) from exc
        self.worker_id = self.state_dir.worker_id(config.worker_id)
        self.punctuator = Punctuator(
            config.topics,
            timer_key(config.keyring, config.timer_key_id, config.timer_key_file),
            config.keyring,
        )
        self.keyring = KeyringWatch(config.keyring, config.keyring_file)
        self._last_punctuation = 0.0
        self.consumer: Consumer | None = None
        # Kept until the process ends, also when broken (see producer.py).
        self.producer: TransactionalProducer | None = None
        #: The group lost its coordinator (partitions lost): the producer may have cached
        #: the dead one, and its next send_offsets_to_transaction would block on it.
        self._stale_coordinator = False
        self.transaction: Transaction | None = None
        # The previous transaction while its commit travels; `transaction` decides meanwhile.
        self.committing: Transaction | None = None
        # HTTP reads wait for the commit in flight to reach the stores (read_fence.py).
        self.read_fence = ReadFence()
        self._fenced: int | None = None
        self.broken = False  # gave up on its clients: never call them again
        self._restores: list[RestoreJob] = []
        self.assigned = False  # has had an assignment (possibly empty) from the group
        self.last_turn = time.monotonic()  # when the loop last turned (liveness)
        self.heap = IdleTrim()
        self.verifier = BatchVerifier()

    # -- life cycle ------------------------------------------------------------
    def start(self) -> None:
        topics = check_topics(self.config)
        self.partitions, self.limits = topics.partitions, topics.limits
        self.commit_limits = CommitLimits(self.topics, self.limits)
        settings = self.config.kafka
        # Stores restored from other topics (deleted and created again) are discarded;
        # a changed partition count stops the worker (see identity.py).
        found = identity.current(AdminClient(settings.client()), self.topics, self.partitions)
        identity.reconcile(self.state_dir.root, found, self.state_dir.stores())
        self.producer = self._new_producer()
        self.transaction = self._new_transaction()
        self.consumer = Consumer(
            settings.client(
                {
                    "group.id": self.config.group_id,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "isolation.level": "read_committed",
                    "partition.assignment.strategy": assignment_strategy(
                        self.config.static_membership
                    ),
                    "enable.partition.eof": False,
                    **(
                        {"client.id": client_id(self.advertised_url)} if self.advertised_url else {}
                    ),
                    **(
                        {"group.instance.id": f"{self.config.group_id}-{self.worker_id}"}
                        if self.config.static_membership
                        else {}
                    ),
                },
                defaults={
                    # Failover after a crash takes up to this long (Kafka's default is 45 s).
                    "session.timeout.ms": 10_000,
                    "heartbeat.interval.ms": 2_000,
                    "queued.max.messages.kbytes": CONSUME_QUEUE_KBYTES,
                },
            )
        )
        self.consumer.subscribe(
            [self.topics.proposals],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info(
            "worker %s joined group %s on %s (%d partitions)",
            self.worker_id,
            self.config.group_id,
            self.topics.proposals,
            self.partitions,
        )

    def _new_producer(self) -> TransactionalProducer:
        """The transactional producer, its id's previous transaction ended (fenced)."""
        producer = TransactionalProducer(
            self.config.kafka,
            f"{self.config.group_id}-{self.worker_id}",
            self.config.transaction_timeout_ms,
            batch_size(self.config.kafka, self.limits, DEFAULT_BATCH_SIZE),
        )
        producer.init()
        return producer

    def _finished(self, snapshot: RunSnapshot) -> bool:
        """Whether a run has finished (its stores keep finished runs out of the cache)."""
        return is_finished(
            self.config.machines, snapshot.machine, snapshot.machine_version, snapshot.state
        )

    def _new_transaction(self, after: Transaction | None = None) -> Transaction:
        assert self.producer is not None
        return Transaction(self.producer, self.stores, self.topics, self.metrics, after)

    def stop(self) -> None:
        """Ask the loop to finish: it commits what it has, leaves the group, closes."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """Process until `stop()`; then transaction, leave the group and close stores."""
        if self.consumer is None:
            self.start()
        assert self.consumer is not None and self.producer is not None
        interval = self.config.commit_interval_ms / 1000
        try:
            while not self._stop.is_set():
                try:
                    self._step(interval)
                except KafkaException as exc:
                    # A produce refused mid-batch (e.g. _STATE after a broker restart):
                    # the transaction cannot commit. Abort it, which rewinds the input to
                    # the committed offsets, and go on from there.
                    if exc.args[0].fatal():
                        raise ClientBroken(f"the producer failed: {exc}") from exc
                    if not self.producer.open:
                        # No transaction to abort, and where the consumer stands is not
                        # known: catch up and rewind as after a hung call (this raise
                        # took the process down, e.g. NOT_COORDINATOR while rewinding).
                        self._replace_producer(ClientBroken(f"a client call failed: {exc}"))
                        continue
                    self._abort(f"transaction failed: {exc}", exc.args[0])
                except ClientBroken as exc:
                    self._replace_producer(exc)
            self._commit()
        except ClientBroken:
            # Its clients may block in any further call, their destructors too: they stay
            # referenced (self.consumer, self.producer) until the process image ends.
            self.broken = True
            raise
        finally:
            self._close()

    def _step(self, interval: float) -> None:
        """One turn of the loop: a batch of proposals, due timers, a transaction if due."""
        assert self.consumer is not None and self.producer is not None
        self.last_turn = time.monotonic()
        if self.committing is not None and self.committing.commit_done:
            self._settle()
        if self._restores:
            self._finish_restores()
        if self._stale_coordinator and (self.stores.owned() or self._restores):
            self._fresh_producer()
        aborts = self.stats.aborts
        batch = self._take()
        verified = self.verifier.verify(self.topics.proposals, batch, self.keyring.current())
        admissions = self._admit(batch, verified)
        for msg, admission in zip(batch, admissions, strict=True):
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise WorkerError(f"the consumer failed: {err}")
                log.warning("consumer: %s", err)
                continue
            assert admission is not None
            self._process(msg, admission)
            if self.stats.aborts != aborts:
                return  # rewound to the committed offsets: the rest comes again
        now = time.monotonic()
        # While records are isolated, a transaction holds one record and nothing else.
        due = now - self._last_punctuation >= self.config.timer_interval_ms / 1000
        if due and not self.quarantine.active:
            self._last_punctuation = now
            self._punctuate(int(time.time() * 1000))
        if now - self._last_lag >= LAG_INTERVAL_S:
            self._last_lag = now
            self._measure_lag()
        transaction = self.transaction
        assert transaction is not None
        # Commit as soon as the input has nothing more for now (a short batch): waiting for
        # the interval only delayed every answer under a steady load (p50 1.1 s at half
        # the drain rate). Under a backlog batches are full, and the interval and the
        # record limit set the cadence.
        full = transaction.records >= self.config.commit_max_records
        commit_due = len(batch) < CONSUME_BATCH or full or now - transaction.started >= interval
        # One commit travels at a time; the next waits for it only when it is full.
        if transaction.open and commit_due and (self.committing is None or full):
            self._start_commit()
        if self.committing is None:  # (the producer is the commit's until it is over)
            self.producer.poll(0)
            if not batch and not transaction.open:  # nothing to do: memory back (heap.py)
                self.heap.idle(self.stats.proposals + self.stats.restored_records, now)

    def _take(self) -> list[Message]:
        """The records the consumer has, waiting for the first only as long as the open
        transaction can wait: not at all when it is ready to commit, briefly while the
        previous one commits (its end is only seen between turns)."""
        assert self.consumer is not None
        transaction = self.transaction
        if self.committing is not None:
            wait = COMMITTING_WAIT_S
        elif transaction is not None and transaction.open:
            wait = 0.0
        else:
            wait = CONSUME_WAIT_S
        batch = self.consumer.consume(num_messages=1, timeout=wait)
        if batch:
            batch.extend(self.consumer.consume(num_messages=CONSUME_BATCH - 1, timeout=0))
        return batch

    def _measure_lag(self) -> None:
        """Records behind per owned partition: the end of the partition (as of the
        latest fetch) minus the next offset to decide."""
        assert self.consumer is not None
        owned = [TopicPartition(self.topics.proposals, p) for p in self.stores.owned()]
        if not owned:
            return
        lag: dict[int, int] = {}
        for tp in self.consumer.position(owned):
            low, high = self.consumer.get_watermark_offsets(tp, cached=True)
            # No position yet: nothing fetched since assignment, all of it is ahead (for
            # the moment before the first fetch, an overstatement).
            start = tp.offset if tp.offset >= 0 else low
            if high >= 0 and start >= 0:
                lag[tp.partition] = max(0, high - start)
        self._lag = lag

    def _close(self) -> None:
        self._cancel_restores()
        self.verifier.close()
        if self.broken:
            # Never call a broken client again: any call may block (see producer.py).
            self.stores.close()
            self.state_dir.release()
            return
        if self.consumer is not None:
            try:
                self.consumer.close()  # leaves the group: on_revoke transactions first
            except (KafkaException, RuntimeError) as exc:
                log.warning("closing consumer: %s", exc)
        if self.producer is not None:
            if self.producer.open or self.committing is not None:
                self._abort("shutting down with an open transaction")
            self.producer.close()
        self._unfence()
        self.stores.close()
        self.state_dir.release()
        log.info("worker %s stopped", self.worker_id)

    # -- processing ------------------------------------------------------------
    def _admit(self, batch: list[Message], verified: Verified) -> list[Admission | None]:
        """Every record of the batch admitted, or refused, before any is decided: one
        pass of the decoder and the verifier over the batch, then one of the engine
        (`admit_record` says why). None for a consumer error."""
        keyring = self.keyring.current()
        partitions = self.partitions
        max_bytes = self.config.max_proposal_bytes
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
                log.exception(
                    "admitting %s[%s]@%s failed", msg.topic(), msg.partition(), msg.offset()
                )
                admitted = DeadLetterReason(f"internal error while deciding: {exc!r}")
            admissions.append(Admission(admitted, clock() - began))
        return admissions

    def _process(self, msg: Message, admission: Admission) -> None:
        partition = msg.partition() or 0
        transaction = self.transaction
        assert transaction is not None
        offset = msg.offset() or 0
        isolated = self.quarantine.isolating(partition, offset)
        if isolated and transaction.open:
            aborts = self.stats.aborts
            self._commit()  # what came before goes in a transaction of its own
            if self.stats.aborts != aborts:
                return
            transaction = self.transaction
            assert transaction is not None
        store = transaction.store(partition)
        if store is None:  # fetched before a revoke; not ours any more
            return
        _, timestamp = msg.timestamp()
        source = Source(msg.topic() or "", partition, offset, msg.key(), msg.value(), timestamp)
        began = time.perf_counter()
        outcome = self._decide(store, source, admission.admitted)
        self.metrics.decision.observe(admission.seconds + time.perf_counter() - began)
        # A poisoned record's DLQ record stays small: it must fit whatever the broker takes.
        limits = self.limits if self.quarantine.poisoned(partition, offset) is None else SMALL
        answers = (
            store.answer_keys(outcome.transition.run_id) if isinstance(outcome, Forget) else ()
        )
        outcome, records = publishable(self.topics, outcome, source, limits, answers, self._relay)
        run_id = outcome_run_id(outcome)
        transaction.observed.stage(store.snapshot(run_id) if run_id else None, outcome)
        transaction.decided(outcome)
        # In the batch before producing: a produce refused at once names this record.
        transaction.consumed(partition, offset)
        for record in records:
            transaction.produce(record, partition if record.partition is None else record.partition)
        if isinstance(outcome, Rejection) and outcome.run_id and store.snapshot(outcome.run_id):
            store.stage_refusal(outcome, records[0].value)  # for the run's inspector page
        if isinstance(outcome, Commit):
            store.stage(outcome, records[0].value, records[-1].value)
        elif isinstance(outcome, Beat):
            store.stage_beat(outcome, records[-1].value)
        elif isinstance(outcome, Forget):
            store.stage_forget(outcome.transition.run_id)
        self.stats.count(outcome)
        if isolated:
            self._commit()

    def _relay(self, proposal: Proposal) -> OutputRecord:
        """A message to another run, signed now (the record's time must be fresh)."""
        return self.punctuator.relay(proposal, int(time.time() * 1000), self.partitions)

    def _decide(
        self, store: PartitionTransaction, source: Source, admitted: Admitted | Outcome
    ) -> Outcome:
        poisoned = self.quarantine.poisoned(source.partition, source.offset)
        if poisoned is not None:
            return DeadLetterReason(
                f"the broker refused this record's outcome {self.quarantine.attempts} times "
                f"({poisoned}); set aside so that the partition goes on"
            )
        if not isinstance(admitted, Admitted):
            return admitted
        try:
            return decide_admitted(
                admitted,
                source.timestamp_ms,
                machines=self.config.machines,
                lookup=store.snapshot,
                seen=store.seen,
                max_state_bytes=self.config.max_state_bytes,
                commit_limits=self.commit_limits,
                max_relay_bytes=self.config.max_proposal_bytes,
                relays=self.punctuator.relays,
            )
        except Exception as exc:  # a bug must not turn one record into a stalled partition
            log.exception(
                "deciding %s[%s]@%s failed", source.topic, source.partition, source.offset
            )
            return DeadLetterReason(f"internal error while deciding: {exc!r}")

    # -- timers -------------------------------------------------------------------
    def _punctuate(self, now_ms: int) -> None:
        """Fire every due timer once, into the open transaction (see punctuator.py)."""
        transaction = self.transaction
        assert transaction is not None
        for partition in self.stores.owned():
            store = transaction.store(partition)
            if store is None:
                continue
            for firing in self.punctuator.fire(now_ms, store, store.store.due_runs(now_ms)):
                for record in firing.records:
                    transaction.produce(record, partition)
                transaction.records += 1
                firing.log()
                self.stats.fired(firing)
                if not firing.is_deadline:
                    transaction.observed.stage_alert(firing.snapshot.machine, firing.timer.name)

    # -- transactions -----------------------------------------------------------
    def _commit(self) -> None:
        """Commit the open transaction, if any, and start the next; wait for both."""
        self._start_commit()
        self._settle()

    def _start_commit(self) -> None:
        """Start the open transaction's commit, after the one in flight (if any) is over;
        the next transaction decides meanwhile, over its changes."""
        if not self._settle():
            return
        transaction = self.transaction
        if transaction is None or not transaction.open:
            return
        assert self.consumer is not None
        self._unfence()  # (settled above: none is open; a leaked one would stall reads)
        self._fenced = self.read_fence.open()  # before its outcomes can be seen
        transaction.start_commit(self.consumer.consumer_group_metadata())
        self.committing = transaction
        self.transaction = self._new_transaction(after=transaction)

    def _settle(self) -> bool:
        """Wait for the commit in flight, if any, and finish it: the stores move, and the
        open transaction produces what it held. False when it failed (then aborted)."""
        committing, self.committing = self.committing, None
        if committing is None:
            return True
        try:
            committed = committing.finish_commit()
        except KafkaException as exc:
            self._abort(f"transaction failed: {exc}", exc.args[0], failed=committing)
            return False
        self._committed(committed)
        self._unfence()
        transaction = self.transaction
        assert transaction is not None
        transaction.settled()
        return True

    def _unfence(self) -> None:
        """The commit in flight is over: its changes are in the stores, or nowhere."""
        fenced, self._fenced = self._fenced, None
        if fenced is not None:
            self.read_fence.close(fenced)

    def _committed(self, committed: dict[int, int]) -> None:
        for partition, next_offset in committed.items():
            self.quarantine.committed(partition, next_offset)
        self.stats.transactions += 1

    def _abort(
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
        self.transaction = self._new_transaction()
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
            self._swap_producer()  # between transactions; its batch.size from the limits
        self._unfence()
        self._rewind(self.stores.owned())
        self.stats.aborts += 1

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

    def _replace_producer(self, why: ClientBroken) -> None:
        """Go on with a new producer of the same transactional id after a call of the
        old one hung (librdkafka can block for good when a coordinator moves): the new
        one's init fences the old and ends its transaction, committed or aborted, which
        nobody here can know. So both open transactions are dropped unapplied, and the
        owned stores catch up from the changelog (only what they lack) before their
        partitions resume from the committed offsets. The restart in place this
        replaces cost a rejoin, a rebalance of the whole group and a restore."""
        log.error("%s; replacing the producer (the new one fences the old)", why)
        assert self.producer is not None and self.consumer is not None
        self.committing = None
        self.stats.aborts += 1
        self.metrics.aborted()
        old = self.producer
        self.producer = self._new_producer()  # ClientBroken if it cannot: restart in place
        # Only now, fenced by the new one's init, may the old one be closed.
        old.retire(why.returned if isinstance(why, ClientHung) else None)
        self._stale_coordinator = False
        self.transaction = self._new_transaction()
        owned = self.stores.owned()
        if owned:
            self.consumer.pause([TopicPartition(self.topics.proposals, p) for p in owned])
            self._restores.append(
                RestoreJob(self.config.kafka, self.topics, self.stores.take(owned))
            )
            self.metrics.restoring.set(1)
            log.info("partitions %s catching up from the changelog", owned)
        # The commit in flight may have gone through or not: the stores that might lack
        # it are out of reach until they have caught up, so reads wait no longer.
        self._unfence()

    def _fresh_producer(self) -> None:
        """After the group lost its coordinator, and once partitions came back (the
        brokers answer again), a new producer between transactions: librdkafka can keep
        the dead coordinator cached and block the next send_offsets_to_transaction on it
        (#5511), seen after every coordinator kill; a fresh one looks it up. The old one
        holds no transaction; it is closed in a thread of its own, in case it blocks."""
        transaction = self.transaction
        if self.committing is not None or transaction is None or transaction.open:
            return  # at the next turn without a transaction
        self._stale_coordinator = False
        self._swap_producer()
        log.info("the group's coordinator moved: a new producer, with no stale coordinator")

    def _swap_producer(self) -> None:
        """A new producer, with the worker's settings as they are, while no transaction is
        open; the old one, holding none, is closed in a thread of its own (it may block)."""
        assert self.producer is not None
        old, self.producer = self.producer, self._new_producer()
        self.transaction = self._new_transaction()
        threading.Thread(target=old.close, name="runstate-old-producer", daemon=True).start()

    def _rewind(self, partitions: list[int]) -> None:
        """Seek `partitions` back to their committed offsets (what an aborted transaction
        consumed is decided again). Asking for them waits out a moving group coordinator
        (NOT_COORDINATOR, seen when a broker is killed or paused); when it does not come
        back, ClientBroken: going on from where the consumer stands would skip what the
        abort undid, so the partitions wait for a new producer's catch-up instead."""
        if not partitions or self.consumer is None:
            return
        wanted = [TopicPartition(self.topics.proposals, p) for p in partitions]
        deadline = time.monotonic() + REWIND_PATIENCE_S
        while True:
            try:
                committed = self.consumer.committed(wanted, timeout=REWIND_CALL_S)
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
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            try:
                self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            except KafkaException as exc:  # not yet fetching: the committed offset applies
                log.debug("seek %s: %s", tp, exc)

    # -- rebalancing -----------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Take the partitions, paused, and restore their stores beside the loop: a
        restore inside this callback held the loop, and one longer than
        max.poll.interval.ms cost the worker its place in the group."""
        assigned = sorted(tp.partition for tp in partitions)
        if not assigned:
            self.assigned = True
            return
        if self.config.static_membership:  # eager: this is the whole assignment
            consumer.assign(partitions)
        else:
            consumer.incremental_assign(partitions)
        consumer.pause(partitions)
        new = {
            p: PartitionStore(self.state_dir.partition(p), finished=self._finished)
            for p in assigned
        }
        self._restores.append(RestoreJob(self.config.kafka, self.topics, new))
        self.assigned = True  # after the job is listed: /readyz must not see a gap
        self.metrics.restoring.set(1)
        log.info("assigned partitions %s: restoring their stores", assigned)

    def _finish_restores(self) -> None:
        """Partitions whose restore is done join the owned ones and are resumed, from
        their committed offsets (anything fetched before the pause was not decided)."""
        for job in [j for j in self._restores if j.done]:
            if job.error is not None:
                raise job.error
            self.metrics.restored.inc(job.applied)
            self.stats.restored_records += job.applied
            self.stores.add(job.stores)
            # After its stores are owned (no gap for /readyz), before anything that can
            # raise: a job left listed had its stores closed twice when the partitions went.
            self._restores.remove(job)
            partitions = sorted(job.stores)
            self._rewind(partitions)
            assert self.consumer is not None
            self.consumer.resume([TopicPartition(self.topics.proposals, p) for p in partitions])
            log.info("restored partitions %s (now %s)", partitions, self.stores.owned())
        if not self._restores:
            self.metrics.restoring.set(0)

    def _cancel_restores(self, partitions: list[int] | None = None) -> None:
        """Stop restoring `partitions` (all: None) and close their stores."""
        for job in list(self._restores):
            if partitions is None or set(job.stores) & set(partitions):
                job.cancel()
                self._restores.remove(job)
                keep = {p: s for p, s in job.stores.items() if partitions and p not in partitions}
                for p, store in job.stores.items():
                    if p not in keep:
                        store.close()
                if keep:  # the rest of that job's partitions are still ours
                    self._restores.append(RestoreJob(self.config.kafka, self.topics, keep))
        if not self._restores:
            self.metrics.restoring.set(0)

    @property
    def restoring(self) -> list[int]:
        return sorted(p for job in self._restores for p in job.stores)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Commit what was processed while the generation is still valid, then let go
        # (also when the commit failed for good: the partitions are not ours any more,
        # whatever the producer does next).
        with self._letting_go(partitions):
            self._commit()

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another worker owns them already: our open transaction must not commit (a
        # commit in flight has its outcome applied, whichever it is, before the stores go).
        with self._letting_go(partitions):
            transaction = self.transaction
            if self.committing is not None or (transaction is not None and transaction.open):
                self._abort("partitions lost")
            self._stale_coordinator = True

    @contextmanager
    def _letting_go(self, partitions: list[TopicPartition]) -> Iterator[None]:
        """Around what a rebalance callback does before the partitions go: they go (their
        restores cancelled, their stores dropped) whatever it raised."""
        try:
            yield
        except ClientBroken:  # the loop replaces the producer; nothing staged may stay
            self.transaction = self._new_transaction()
            raise
        finally:
            self._cancel_restores([tp.partition for tp in partitions])
            self._drop([tp.partition for tp in partitions])

    def _drop(self, partitions: list[int]) -> None:
        if self.transaction is not None:
            self.transaction.release(partitions)
        self.stores.drop(partitions)
        for p in partitions:
            self._lag.pop(p, None)
        if partitions:
            log.info("released partitions %s (now %s)", sorted(partitions), self.stores.owned())


def assignment_strategy(static_membership: bool) -> str:
    """Cooperative rebalancing moves partitions in two rounds: the owner gives them up,
    then rejoins so they can go elsewhere. A static member killed between the two is
    replaced without a rebalance (its restart rejoins a stable group), so nobody rejoins
    and the partitions it gave up stay unowned until the membership changes again (seen
    in the fault harness: two of three partitions idle for minutes). Eager rebalancing
    hands out the whole assignment in one round, so static members use it."""
    return "roundrobin" if static_membership else "cooperative-sticky"


def default_state_dir() -> Path:
    return Path(os.environ.get("RUNSTATE_STATE_DIR", "./state"))
