"""The native worker: proposals in, transitions/rejections/DLQ out, exactly once.

The loop; each job is a part of its own, which owns its state:
- `CommitPipeline` (commits.py): the transactional producer, the open transaction and
  the commit in flight; commit, abort and rewind, a producer replaced or swapped;
- `Transaction` (transaction.py): one Kafka transaction, from the first record consumed
  to the commit that moves the stores (its module says the order);
- `TransactionalProducer` (producer.py): begin, produce, send offsets, commit, abort,
  with librdkafka's known hangs bounded;
- `Assignment` (assignment.py): the group's callbacks, the restores they start, the lag;
- `proposals_consumer` (consumer.py): the consumer's settings and rebalancing protocol;
- `StoreRegistry` / `PartitionStore` (stores.py, store/): the owned partitions' state;
- `Punctuator` (processor/records/punctuator.py, shared with the Faust runtime): due timers
  as records;
- `Quarantine` (poison.py): records whose outcome the broker keeps refusing;
- `check_topics` (preflight.py): the topics fit the worker, and what records they take;
- `WorkerQueries` (queries.py): what the HTTP API (processor/serving/api.py) asks of it;
- `admit_batch` (../admission.py): a turn admits its whole batch first (signatures,
  schema, placement);
- `Processing` (processing.py): then each record is decided (`decide_admitted`, pure),
  produced and staged, and due timers fire, into the open transaction.
When the input has nothing more for now, and at the latest every 100 ms (or N
records), the open transaction commits; on any failure it is
aborted, and the consumer rewound to the committed offsets: nothing is half-applied.
"""

import logging
import threading
import time

from confluent_kafka import Consumer, KafkaException, Message
from confluent_kafka.admin import AdminClient

from processor.observe.metrics import WorkerMetrics
from processor.records.punctuator import Punctuator, timer_key
from processor.runtimes import identity
from processor.runtimes.admission import Admitting, admit_batch
from processor.runtimes.errors import ClientBroken, WorkerError
from processor.runtimes.native.assignment import Assignment
from processor.runtimes.native.commits import CommitPipeline
from processor.runtimes.native.consumer import proposals_consumer
from processor.runtimes.native.heap import IdleTrim
from processor.runtimes.native.poison import Quarantine
from processor.runtimes.native.preflight import check_topics
from processor.runtimes.native.processing import Processing, WorkerStats
from processor.runtimes.native.snapshot_cache import SNAPSHOTS
from processor.runtimes.native.statedir import StateDir, StateDirBusy
from processor.runtimes.native.stores import StoreRegistry
from processor.runtimes.settings import WorkerConfig
from processor.runtimes.verifier import BatchVerifier
from processor.serving.read_fence import ReadFence
from processor.trust.keyring import KeyringWatch

log = logging.getLogger("runstate.worker")

LAG_INTERVAL_S = 1.0
# Records taken from the consumer per turn of the loop at most. A turn waits for the
# first of them only (`_take`): librdkafka's batch call waits its whole timeout to fill
# the batch, and with a 20 ms wait that was ~20 ms of every answer at a trickle.
CONSUME_BATCH = 500
# How long an idle turn waits for a first record (timers and lag are looked at between).
CONSUME_WAIT_S = 0.02
# How long a turn waits while a commit travels: its end is seen at the next turn, and the
# records held for it are produced then (the worker cannot be woken by the commit).
COMMITTING_WAIT_S = 0.002


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
        self._last_lag = 0.0
        self.metrics = WorkerMetrics(
            config.machines,
            lambda: self.stores.runs_by_state(config.machines),
            lambda: dict(self.assignment.lag),
            lambda: self.stores.memory(),
            lambda: len(SNAPSHOTS),
        )
        try:
            self.state_dir = StateDir(
                config.settings.state_dir, config.settings.group_id, config.topics.proposals
            ).claim()
        except StateDirBusy as exc:
            raise WorkerError(str(exc)) from exc
        self.worker_id = self.state_dir.worker_id(config.settings.worker_id)
        self.punctuator = Punctuator(
            config.topics,
            timer_key(config.keyring, config.settings.timer_key_id, config.settings.timer_key_file),
            config.keyring,
        )
        self.keyring = KeyringWatch(config.keyring, config.settings.keyring_file)
        self._last_punctuation = 0.0
        self.consumer: Consumer | None = None
        self.commits = CommitPipeline(
            config,
            f"{config.settings.group_id}-{self.worker_id}",
            self.stores,
            self.quarantine,
            self.metrics,
            self.stats,
        )
        self.assignment = Assignment(
            config, self.state_dir, self.stores, self.commits, self.metrics, self.stats
        )
        self.broken = False  # gave up on its clients: never call them again
        self.last_turn = time.monotonic()  # when the loop last turned (liveness)
        self.heap = IdleTrim()
        self.verifier = BatchVerifier()
        self.processing = Processing(
            config,
            self.commits,
            self.stores,
            self.quarantine,
            self.punctuator,
            self.metrics,
            self.stats,
            lambda: self.partitions,
        )

    @property
    def read_fence(self) -> ReadFence:
        """HTTP reads wait on it for the commit in flight to reach the stores."""
        return self.commits.read_fence

    @property
    def assigned(self) -> bool:
        return self.assignment.assigned

    @property
    def restoring(self) -> list[int]:
        return self.assignment.restoring

    # -- life cycle ------------------------------------------------------------
    def start(self) -> None:
        topics = check_topics(self.config)
        self.partitions = topics.partitions
        settings = self.config.kafka
        # Stores restored from other topics (deleted and created again) are discarded;
        # a changed partition count stops the worker (see identity.py).
        found = identity.current(AdminClient(settings.client()), self.topics, self.partitions)
        identity.reconcile(self.state_dir.root, found, self.state_dir.stores())
        self.commits.start(topics.limits)
        self.consumer = proposals_consumer(self.config, self.worker_id, self.advertised_url)
        self.commits.consumer = self.consumer
        self.consumer.subscribe(
            [self.topics.proposals],
            on_assign=self.assignment.on_assign,
            on_revoke=self.assignment.on_revoke,
            on_lost=self.assignment.on_lost,
        )
        log.info(
            "worker %s joined group %s on %s (%d partitions)",
            self.worker_id,
            self.config.settings.group_id,
            self.topics.proposals,
            self.partitions,
        )

    def stop(self) -> None:
        """Ask the loop to finish: it commits what it has, leaves the group, closes."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """Process until `stop()`; then commit, leave the group and close stores."""
        if self.consumer is None:
            self.start()
        commits = self.commits
        assert self.consumer is not None and commits.producer is not None
        interval = self.config.settings.commit_interval_ms / 1000
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
                    if not commits.producer.open:
                        # No transaction to abort, and where the consumer stands is not
                        # known: catch up and rewind as after a hung call (e.g.
                        # NOT_COORDINATOR while rewinding), rather than end the process.
                        self._replace_producer(ClientBroken(f"a client call failed: {exc}"))
                        continue
                    commits.abort(f"transaction failed: {exc}", exc.args[0])
                except ClientBroken as exc:
                    self._replace_producer(exc)
            commits.commit()
        except ClientBroken:
            # Its clients may block in any further call, their destructors too: they stay
            # referenced (self.consumer, commits.producer) until the process image ends.
            self.broken = True
            raise
        finally:
            self._close()

    def _replace_producer(self, why: ClientBroken) -> None:
        """A new producer after a call of the old one hung, both open transactions
        dropped unapplied (commits.py says why); the owned stores catch up from the
        changelog before their partitions resume. The restart in place this replaces
        cost a rejoin, a rebalance of the whole group and a restore."""
        assert self.consumer is not None
        self.commits.replace_producer(why)
        self.assignment.catch_up(self.consumer)
        # The commit in flight may have gone through or not: the stores that might lack
        # it are out of reach until they have caught up, so reads wait no longer.
        self.commits.unfence()

    def _step(self, interval: float) -> None:
        """One turn of the loop: a batch of proposals, due timers, a commit if due."""
        commits = self.commits
        assert self.consumer is not None and commits.producer is not None
        self.last_turn = time.monotonic()
        if commits.committing is not None and commits.committing.commit_done:
            commits.finish_commit()
        if self.assignment.restores:
            self.assignment.finish_restores(self.consumer)
        if commits.stale_coordinator and (self.stores.owned() or self.assignment.restores):
            commits.fresh_producer()
        aborts = self.stats.aborts
        batch = self._take()
        verified = self.verifier.verify(
            self.topics.proposals,
            ((m.key(), m.value(), m.headers()) for m in batch if m.error() is None),
            self.keyring.current(),
        )
        admitting = Admitting(
            self.keyring.current(),
            self.partitions,
            self.config.settings.max_proposal_bytes,
            verified,
        )
        admissions = admit_batch(batch, admitting)
        for msg, admission in zip(batch, admissions, strict=True):
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise WorkerError(f"the consumer failed: {err}")
                log.warning("consumer: %s", err)
                continue
            assert admission is not None
            self.processing.record(msg, admission)
            if self.stats.aborts != aborts:
                return  # rewound to the committed offsets: the rest comes again
        now = time.monotonic()
        # While records are isolated, a transaction holds one record and nothing else.
        due = now - self._last_punctuation >= self.config.settings.timer_interval_ms / 1000
        if due and not self.quarantine.active:
            self._last_punctuation = now
            self.processing.timers(int(time.time() * 1000))
        if now - self._last_lag >= LAG_INTERVAL_S:
            self._last_lag = now
            self.assignment.measure_lag(self.consumer)
        transaction = commits.transaction
        assert transaction is not None
        # Commit as soon as the input has nothing more for now (a short batch): waiting for
        # the interval only delayed every answer under a steady load (p50 1.1 s at half
        # the drain rate). Under a backlog batches are full, and the interval and the
        # record limit set the cadence.
        full = transaction.records >= self.config.settings.commit_max_records
        commit_due = len(batch) < CONSUME_BATCH or full or now - transaction.started >= interval
        # One commit travels at a time; the next waits for it only when it is full.
        if transaction.open and commit_due and (commits.committing is None or full):
            commits.start_commit()
        if commits.committing is None:  # (the producer is the commit's until it is over)
            commits.producer.poll(0)
            if not batch and not transaction.open:  # nothing to do: memory back (heap.py)
                self.heap.idle(self.stats.proposals + self.stats.restored_records, now)

    def _take(self) -> list[Message]:
        """The records the consumer has, waiting for the first only as long as the open
        transaction can wait: not at all when it is ready to commit, briefly while the
        previous one commits (its end is only seen between turns)."""
        assert self.consumer is not None
        transaction = self.commits.transaction
        if self.commits.committing is not None:
            wait = COMMITTING_WAIT_S
        elif transaction is not None and transaction.open:
            wait = 0.0
        else:
            wait = CONSUME_WAIT_S
        batch = self.consumer.consume(num_messages=1, timeout=wait)
        if batch:
            batch.extend(self.consumer.consume(num_messages=CONSUME_BATCH - 1, timeout=0))
        return batch

    def _close(self) -> None:
        self.assignment.cancel_restores()
        self.verifier.close()
        if self.broken:
            # Never call a broken client again: any call may block (see producer.py).
            self.stores.close()
            self.state_dir.release()
            return
        if self.consumer is not None:
            try:
                self.consumer.close()  # leaves the group: on_revoke commits first
            except (KafkaException, RuntimeError) as exc:
                log.warning("closing consumer: %s", exc)
        self.commits.close()
        self.stores.close()
        self.state_dir.release()
        log.info("worker %s stopped", self.worker_id)
