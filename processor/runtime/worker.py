"""The native worker: proposals in, transitions/rejections/DLQ out, exactly once.

Per checkpoint (about every 100 ms, or every N records), in this order:
1. decide each consumed proposal against the partition store (staged changes seen);
2. produce its outcome and, for a commit, the run's snapshot to the changelog, all to
   the same partition number as the proposal, inside one Kafka transaction;
3. add the consumed offsets to the transaction (EOS v2: group metadata) and commit;
4. only then write the staged snapshots, history and the changelog/transitions
   offsets to RocksDB in one WriteBatch.
On any failure before 4 the transaction is aborted, staged state dropped and the
consumer rewound to the committed offsets: nothing is half-applied.
"""

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from processor.config import KafkaSettings
from processor.engine import Commit, Machine
from processor.intake import DEFAULT_MAX_PROPOSAL_BYTES, Headers, signed_headers
from processor.keyring import Keyring
from processor.logs import OUTCOMES_LOG, log_outcomes
from processor.pipeline import DEFAULT_MAX_STATE_BYTES, DeadLetterReason, Outcome, decide_record
from processor.runtime import cluster
from processor.runtime.metrics import WorkerMetrics
from processor.runtime.outputs import (
    DEFAULT_MESSAGE_MAX_BYTES,
    RECORD_OVERHEAD,
    UNLIMITED,
    RecordLimits,
    Source,
    dead_letter_record,
    outcome_records,
)
from processor.runtime.poison import Quarantine, is_record_error
from processor.runtime.restore import restore_partitions
from processor.runtime.statedir import StateDir, StateDirBusy
from processor.runtime.store import FIRED_CHANGELOG_PREFIX, InState, PartitionStore
from processor.topics import TopicNames, describe_topics, max_message_bytes, plan_topics
from schemas.identifiers import MAX_PROPOSAL_ID_BYTES, MAX_RUN_ID_BYTES
from schemas.messages import Alert, Proposal, Rejection, RunSnapshot, Timer

log = logging.getLogger("runstate.worker")


class WorkerError(RuntimeError):
    """The worker cannot run as configured; the message says what to change."""


class ClientBroken(WorkerError):
    """The transactional producer cannot go on (a fatal error, e.g. after a broker
    restart the coordinator ended its transaction: INVALID_TXN_STATE). Nothing is
    half-applied: the stores move only after a commit returned. The process should
    start again (the CLI restarts it in place)."""


class ClientHung(ClientBroken):
    """A transactional call of librdkafka did not return long after its timeout
    (librdkafka #5456, #5511: send_offsets_to_transaction can block forever when the
    group coordinator goes away, as in a broker restart)."""


# How long past its own timeout a transactional call may take before it counts as hung.
HUNG_AFTER_S = 5.0
# send_offsets_to_transaction's own timeout: past the transaction timeout (10 s by
# default) the coordinator aborts the transaction anyway.
SEND_OFFSETS_TIMEOUT_S = 10.0
LAG_INTERVAL_S = 1.0
QUEUE_FULL_LIMIT_S = 60.0
# For the DLQ record of a record whose outcome the broker refused: a few KB of its bytes.
SMALL = RecordLimits(default=8 * 1024)

# Clients of a worker that gave up on them (ClientBroken). Dropping the last reference
# would run their destructors, and rd_kafka_destroy / consumer close block for as long
# as a call of theirs hangs (seen: a broker restart froze the worker there, never
# reaching its restart). Held here, they end with the process image (`exec`).
ABANDONED_CLIENTS: list[object] = []


def bounded(what: str, call: Callable[[], object], timeout_s: float) -> None:
    """Run a blocking librdkafka call, raising ClientHung if it outlives its timeout."""
    done = threading.Event()
    failure: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=target, name=f"runstate-{what}", daemon=True).start()
    if not done.wait(timeout_s + HUNG_AFTER_S):
        raise ClientHung(f"{what} has not returned after {timeout_s + HUNG_AFTER_S:.0f}s")
    if failure:
        raise failure[0]


@dataclass
class WorkerConfig:
    kafka: KafkaSettings
    topics: TopicNames
    keyring: Keyring
    machines: Mapping[str, Machine]
    state_dir: Path
    group_id: str = "runstate"
    worker_id: str | None = None
    commit_interval_ms: int = 100
    commit_max_records: int = 1_000
    max_proposal_bytes: int = DEFAULT_MAX_PROPOSAL_BYTES
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES
    transaction_timeout_ms: int = 10_000
    timer_interval_ms: int = 200
    timer_key_id: str | None = None  # keyring key that signs deadline proposals
    static_membership: bool = False  # group.instance.id = worker id (KIP-345)
    http_host: str = "127.0.0.1"
    http_port: int | None = 0  # None: no HTTP server; 0: a free port


@dataclass
class WorkerStats:
    proposals: int = 0
    transitions: int = 0
    rejections: int = 0
    dead_letters: int = 0
    checkpoints: int = 0
    aborts: int = 0
    restored_records: int = 0
    deadlines_fired: int = 0
    alerts_raised: int = 0
    started_at: float = field(default_factory=time.time)


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.topics = config.topics
        self.stats = WorkerStats()
        self.stores: dict[int, PartitionStore] = {}
        self.stores_lock = threading.RLock()  # HTTP threads read stores
        self.partitions = 0
        # The URL other workers reach this one's HTTP API at (set before start()): it
        # goes into the consumer's client.id, where cluster queries find it.
        self.advertised_url: str | None = None
        self._admin: AdminClient | None = None
        self._stop = threading.Event()
        self._txn_open = False
        self._txn_started = 0.0
        self._pending = 0
        self._positions: dict[int, int] = {}  # partition -> next offset after the batch
        self._batch_first: dict[int, int] = {}  # partition -> first offset in the batch
        # Records whose outcome the broker keeps refusing (poison.py).
        self.quarantine = Quarantine()
        # What each output topic takes (learned at start).
        self.limits: RecordLimits = UNLIMITED
        self._delivered: dict[tuple[str, int], int] = {}
        self._delivery_error: KafkaError | None = None
        self._lag: dict[int, int] = {}
        self._last_lag = 0.0
        # Outcomes of the open transaction, logged once it commits (seed 003's levels).
        self._to_log: list[Commit | Rejection | DeadLetterReason] = []
        self.metrics = WorkerMetrics(config.machines, self._runs_by_state, lambda: dict(self._lag))
        try:
            self.state_dir = StateDir(
                config.state_dir, config.group_id, config.topics.proposals
            ).claim()
        except StateDirBusy as exc:
            raise WorkerError(str(exc)) from exc
        self.worker_id = self.state_dir.worker_id(config.worker_id)
        self._timer_key = self._pick_timer_key(config)
        self._last_punctuation = 0.0
        self.consumer: Consumer | None = None
        self.producer: Producer | None = None

    # -- life cycle ------------------------------------------------------------
    @staticmethod
    def _pick_timer_key(config: WorkerConfig) -> tuple[str, str]:
        """(key id, secret) that signs the proposals deadlines become: a runtime key."""
        keys = config.keyring.keys
        if config.timer_key_id is not None:
            entry = keys.get(config.timer_key_id)
            if entry is None:
                raise WorkerError(f"--timer-key-id {config.timer_key_id} is not in the keyring")
            return config.timer_key_id, entry.secret
        for key_id, entry in sorted(keys.items()):
            if entry.authority == "runtime":
                return key_id, entry.secret
        raise WorkerError(
            "the keyring has no key with authority 'runtime'; deadlines are proposed with "
            "one (add it, or name one with --timer-key-id)"
        )

    def _check_topics(self) -> None:
        admin = AdminClient(self.config.kafka.client())
        try:
            metadata = admin.list_topics(timeout=30)
        except KafkaException as exc:
            raise WorkerError(
                f"cannot reach Kafka at {self.config.kafka.bootstrap_servers}: {exc}"
            ) from exc
        proposals = metadata.topics.get(self.topics.proposals)
        if proposals is None or proposals.error is not None:
            raise WorkerError(
                f"topic {self.topics.proposals} does not exist; run `runstate topics create`"
            )
        self.partitions = len(proposals.partitions)
        plans = plan_topics(self.topics, self.partitions, 1)
        # Co-partitioning matters (outputs go to the proposal's partition number), and so
        # do broker timestamps (the time of each decision); replication and retention
        # are the operator's business, so not checked here.
        drift = [
            d
            for d in describe_topics(admin, plans)
            if d.setting in ("existence", "partitions", "cleanup.policy", "message.timestamp.type")
        ]
        if drift:
            raise WorkerError(
                "topics do not fit the worker: "
                + "; ".join(str(d) for d in drift)
                + ". Fix with `runstate topics create` (or recreate the topics)."
            )
        producer_max = int(
            self.config.kafka.client_config.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES)
        )
        topics = self.topics
        outputs = [topics.transitions, topics.rejections, topics.dlq, topics.changelog]
        self.limits = RecordLimits.learn(
            max_message_bytes(admin, [*outputs, topics.alerts, topics.proposals]), producer_max
        )
        # A commit writes a snapshot and a transition of up to max_state_bytes, keyed by
        # the run id: the topics must take them, or the broker would refuse a commit.
        needed = self.config.max_state_bytes + MAX_RUN_ID_BYTES + len(FIRED_CHANGELOG_PREFIX)
        for topic in (topics.transitions, topics.changelog):
            if self.limits.of(topic) < needed:
                raise WorkerError(
                    f"topic {topic} takes records of up to {self.limits.of(topic)} bytes "
                    f"(max.message.bytes, and the producer's message.max.bytes, less "
                    f"{RECORD_OVERHEAD} for framing), but a commit may write "
                    f"{needed} (--max-state-bytes {self.config.max_state_bytes} plus the "
                    f"key): raise max.message.bytes on {topic} or lower --max-state-bytes"
                )

    def start(self) -> None:
        self._check_topics()
        settings = self.config.kafka
        self.producer = Producer(
            settings.client(
                {
                    "transactional.id": f"{self.config.group_id}-{self.worker_id}",
                    "on_delivery": self._on_delivery,
                },
                defaults={
                    # A dead worker's open transaction holds back read_committed
                    # consumers until it times out: keep that short (as Kafka Streams).
                    "transaction.timeout.ms": self.config.transaction_timeout_ms,
                    "linger.ms": 5,
                    "compression.type": "lz4",
                },
            )
        )
        # Fences (aborts) whatever a previous run of this worker left open.
        self.producer.init_transactions(60)
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
                        {"client.id": cluster.client_id(self.advertised_url)}
                        if self.advertised_url
                        else {}
                    ),
                    **(
                        {"group.instance.id": f"{self.config.group_id}-{self.worker_id}"}
                        if self.config.static_membership
                        else {}
                    ),
                },
                # Failover after a crash takes up to this long (Kafka's default is 45 s).
                defaults={"session.timeout.ms": 10_000, "heartbeat.interval.ms": 2_000},
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

    def stop(self) -> None:
        """Ask the loop to finish: it commits what it has, leaves the group, closes."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """Process until `stop()`; then checkpoint, leave the group and close stores."""
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
                    if not self._txn_open:
                        raise
                    self._abort(f"transaction failed: {exc}", exc.args[0])
            self._checkpoint()
        except ClientBroken:
            # Its clients may block in any further call, their destructors too: keep
            # them referenced until the process ends.
            ABANDONED_CLIENTS.extend([self.consumer, self.producer])
            self.consumer = self.producer = None
            raise
        finally:
            self._close()

    def _step(self, interval: float) -> None:
        """One turn of the loop: a batch of proposals, due timers, a checkpoint if due."""
        assert self.consumer is not None and self.producer is not None
        aborts = self.stats.aborts
        for msg in self.consumer.consume(num_messages=500, timeout=0.05):
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise WorkerError(f"the consumer failed: {err}")
                log.warning("consumer: %s", err)
                continue
            self._process(msg)
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
        if self._txn_open and (
            self._pending >= self.config.commit_max_records
            or time.monotonic() - self._txn_started >= interval
        ):
            self._checkpoint()
        self.producer.poll(0)

    def _measure_lag(self) -> None:
        """Records behind per owned partition: the end of the partition (as of the
        latest fetch) minus the next offset to decide."""
        assert self.consumer is not None
        owned = [TopicPartition(self.topics.proposals, p) for p in sorted(self.stores)]
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

    # -- cluster queries (HTTP threads) -------------------------------------------
    def peers(self) -> list[cluster.Peer]:
        """The group's workers and what they own, from the group's description."""
        if self._admin is None:
            self._admin = AdminClient(self.config.kafka.client())
        return cluster.peers(self._admin, self.config.group_id, self.topics.proposals)

    def owned(self) -> list[int]:
        with self.stores_lock:
            return sorted(self.stores)

    def runs_in_state(
        self, machine: str | None, state: str, after: tuple[int, str] | None, limit: int
    ) -> list[InState]:
        with self.stores_lock:
            stores = list(self.stores.values())
            return cluster.runs_in_state(stores, self.config.machines, machine, state, after, limit)

    def local_stats(self) -> list[tuple[str, str, int, int | None]]:
        with self.stores_lock:
            return cluster.local_stats(list(self.stores.values()), self.config.machines)

    def _runs_by_state(self) -> Iterator[tuple[str, str, int]]:
        """(machine, state, runs) over the owned partitions; every state of every machine,
        zeros included."""
        with self.stores_lock:
            counts = [store.state_counts() for store in self.stores.values()]
        for name, machine in sorted(self.config.machines.items()):
            for state in machine.spec.states:
                yield name, state, sum(c[(name, state)] for c in counts)

    def _close(self) -> None:
        if self.consumer is not None:
            try:
                self.consumer.close()  # leaves the group: on_revoke checkpoints first
            except (KafkaException, RuntimeError) as exc:
                log.warning("closing consumer: %s", exc)
            self.consumer = None
        if self.producer is not None:
            if self._txn_open:
                self._abort("shutting down with an open transaction")
            self.producer.flush(10)
            self.producer = None
        with self.stores_lock:
            for store in self.stores.values():
                store.close()
            self.stores.clear()
        self.state_dir.release()
        log.info("worker %s stopped", self.worker_id)

    # -- processing ------------------------------------------------------------
    def _process(self, msg: Message) -> None:
        partition = msg.partition() or 0
        store = self.stores.get(partition)
        if store is None:  # fetched before a revoke; not ours any more
            return
        offset = msg.offset() or 0
        isolated = self.quarantine.isolating(partition, offset)
        if isolated and self._txn_open:
            aborts = self.stats.aborts
            self._checkpoint()  # what came before goes in a transaction of its own
            if self.stats.aborts != aborts:
                return
        _, timestamp = msg.timestamp()
        source = Source(msg.topic() or "", partition, offset, msg.key(), msg.value(), timestamp)
        began = time.perf_counter()
        outcome = self._decide(store, source, msg.headers())
        self.metrics.decision.observe(time.perf_counter() - began)
        # A poisoned record's DLQ record stays small: it must fit whatever the broker takes.
        limits = self.limits if self.quarantine.poisoned(partition, offset) is None else SMALL
        try:
            records = outcome_records(self.topics, outcome, source, limits)
        except Exception as exc:  # a bug must not turn one record into a stalled partition
            log.exception("publishing %s[%s]@%s failed", source.topic, partition, offset)
            outcome = DeadLetterReason(f"internal error while encoding its outcome: {exc!r}")
            records = [dead_letter_record(self.topics, source, outcome.reason, SMALL)]
        self._begin()
        run_id = (
            outcome.snapshot.run_id
            if isinstance(outcome, Commit)
            else getattr(outcome, "run_id", None)
        )
        self.metrics.stage(store.snapshot(run_id) if run_id else None, outcome)
        if OUTCOMES_LOG.isEnabledFor(logging.WARNING):
            self._to_log.append(outcome)
        # In the batch before producing: a produce refused at once names this record.
        self._batch_first.setdefault(partition, offset)
        self._positions[partition] = offset + 1
        self._pending += 1
        for record in records:
            self._produce(record.topic, record.key, record.value, partition)
        if isinstance(outcome, Rejection) and outcome.run_id and store.snapshot(outcome.run_id):
            store.stage_refusal(outcome, records[0].value)  # for the run's inspector page
        if isinstance(outcome, Commit):
            store.stage(outcome, records[0].value, records[1].value)
            self.stats.transitions += 1
        elif isinstance(outcome, DeadLetterReason):
            self.stats.dead_letters += 1
        else:
            self.stats.rejections += 1
        self.stats.proposals += 1
        if isolated:
            self._checkpoint()

    def _decide(self, store: PartitionStore, source: Source, headers: Headers) -> Outcome:
        poisoned = self.quarantine.poisoned(source.partition, source.offset)
        if poisoned is not None:
            return DeadLetterReason(
                f"the broker refused this record's outcome {self.quarantine.attempts} times "
                f"({poisoned}); set aside so that the partition goes on"
            )
        try:
            return decide_record(
                source.key,
                source.value,
                headers,
                source.timestamp_ms,
                keyring=self.config.keyring,
                machines=self.config.machines,
                lookup=store.snapshot,
                max_bytes=self.config.max_proposal_bytes,
                max_state_bytes=self.config.max_state_bytes,
            )
        except Exception as exc:  # a bug must not turn one record into a stalled partition
            log.exception(
                "deciding %s[%s]@%s failed", source.topic, source.partition, source.offset
            )
            return DeadLetterReason(f"internal error while deciding: {exc!r}")

    def _begin(self) -> None:
        if not self._txn_open:
            assert self.producer is not None
            self.producer.begin_transaction()
            self._txn_open = True
            self._txn_started = time.monotonic()

    # -- timers (the punctuator) -------------------------------------------------
    def _punctuate(self, now_ms: int) -> None:
        """Fire every due timer once: a deadline becomes a runtime-signed proposal on the
        proposals topic, an alert a record on the alerts topic; the mark that it fired
        goes to the changelog in the same transaction, so no restart fires it again."""
        for partition, store in list(self.stores.items()):
            for run_id in store.due_runs(now_ms):
                snapshot = store.snapshot(run_id)
                if snapshot is None:
                    continue
                for timer in snapshot.timers:
                    if timer.due_at_ms > now_ms or store.fired(run_id).covers(
                        timer.revision, timer.name
                    ):
                        continue
                    self._begin()
                    try:
                        if timer.kind == "deadline":
                            self._fire_deadline(partition, snapshot, timer)
                        else:
                            self._raise_alert(partition, snapshot, timer, now_ms)
                    except (KafkaException, WorkerError):
                        raise
                    except Exception:  # a bug must not crash-loop the worker on one timer
                        log.exception(
                            "timer %s of run %s could not fire; marked fired, not retried",
                            timer.name,
                            run_id,
                        )
                    marks = store.stage_fired(run_id, timer.revision, timer.name)
                    self._produce(
                        self.topics.changelog,
                        FIRED_CHANGELOG_PREFIX + run_id.encode(),
                        marks.encode(),
                        partition,
                    )
                    self._pending += 1

    def _fire_deadline(self, partition: int, snapshot: RunSnapshot, timer: Timer) -> None:
        assert timer.event is not None
        proposal = Proposal(
            proposal_id=timer_proposal_id(snapshot.run_id, timer),
            run_id=snapshot.run_id,
            event=timer.event,
            reason=timer.reason,
            # Anything that happened to the run since (an approval, a heartbeat) wins:
            # the deadline is then refused revision_conflict.
            expected_revision=timer.revision,
            metadata={"timer": timer.name, "due_at_ms": timer.due_at_ms},
        )
        value = proposal.model_dump_json(exclude_none=True).encode()
        key_id, secret = self._timer_key
        self._produce(
            self.topics.proposals,
            snapshot.run_id.encode(),
            value,
            partition,
            headers=signed_headers(value, key_id, secret),
        )
        self.stats.deadlines_fired += 1
        log.info(
            "deadline %s of %s (revision %d) fired: proposing %s",
            timer.name,
            snapshot.run_id,
            timer.revision,
            timer.event,
        )

    def _raise_alert(
        self, partition: int, snapshot: RunSnapshot, timer: Timer, now_ms: int
    ) -> None:
        alert = Alert(
            run_id=snapshot.run_id,
            machine=snapshot.machine,
            rule=timer.name,
            state=snapshot.state,
            revision=snapshot.revision,
            retry_count=snapshot.retry_count,
            time_in_state_ms=max(0, now_ms - snapshot.entered_state_at_ms),
            due_at_ms=timer.due_at_ms,
            at_ms=now_ms,
        )
        self._produce(
            self.topics.alerts, snapshot.run_id.encode(), alert.model_dump_json(), partition
        )
        self.stats.alerts_raised += 1
        self.metrics.stage_alert(snapshot.machine, timer.name)
        log.warning("alert %s: run %s in %s", timer.name, snapshot.run_id, snapshot.state)

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: str | bytes,
        partition: int,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        """Outputs go to the proposal's partition number: co-partitioned with the input."""
        assert self.producer is not None
        data = value.encode() if isinstance(value, str) else value
        full_since: float | None = None
        while True:
            try:
                self.producer.produce(
                    topic, value=data, key=key, partition=partition, headers=headers
                )
                return
            except BufferError:
                # Local queue full: let deliveries drain. One that never drains (a producer
                # that lost its broker for good) must not hold the loop, deaf to SIGTERM.
                full_since = full_since or time.monotonic()
                if time.monotonic() - full_since > QUEUE_FULL_LIMIT_S:
                    raise ClientHung(
                        f"the producer's queue stayed full for {QUEUE_FULL_LIMIT_S:.0f}s"
                    ) from None
                self.producer.poll(0.05)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._delivery_error = err
            return
        key = (msg.topic() or "", msg.partition() or 0)
        offset = msg.offset() or 0
        if offset >= self._delivered.get(key, -1):
            self._delivered[key] = offset

    # -- checkpoints -----------------------------------------------------------
    def _checkpoint(self) -> None:
        if not self._txn_open:
            return
        began = time.perf_counter()
        assert self.producer is not None and self.consumer is not None
        try:
            if self.producer.flush(30) > 0:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "flush timed out"))
            if self._delivery_error is not None:
                raise KafkaException(self._delivery_error)
            offsets = [
                TopicPartition(self.topics.proposals, p, off) for p, off in self._positions.items()
            ]
            if offsets:  # a checkpoint of fired timers alone consumed nothing
                metadata = self.consumer.consumer_group_metadata()
                producer = self.producer
                bounded(
                    "send_offsets_to_transaction",
                    lambda: producer.send_offsets_to_transaction(
                        offsets, metadata, SEND_OFFSETS_TIMEOUT_S
                    ),
                    SEND_OFFSETS_TIMEOUT_S,
                )
            self._commit_transaction()
        except KafkaException as exc:
            self._abort(f"checkpoint failed: {exc}", exc.args[0])
            return
        self._txn_open = False
        for partition, next_offset in self._positions.items():
            self.quarantine.committed(partition, next_offset)
        # The transaction is durable: now, and only now, move the local stores.
        for partition, store in self.stores.items():
            offsets_now = {
                topic: self._delivered[(topic, partition)] + 1
                for topic in (self.topics.changelog, self.topics.transitions)
                if (topic, partition) in self._delivered
            }
            store.flush(offsets_now)
        self.metrics.committed(time.perf_counter() - began, self._pending)
        self._log_outcomes()
        self.stats.checkpoints += 1
        self._reset_batch()

    def _commit_transaction(self) -> None:
        assert self.producer is not None
        commit = self.producer.commit_transaction
        for attempt in range(5):
            try:
                bounded("commit_transaction", lambda: commit(30), 30)
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.retriable() and attempt < 4:
                    continue
                raise

    def _log_outcomes(self) -> None:
        logged, self._to_log = self._to_log, []
        log_outcomes(logged)

    def _abort(self, why: str, error: KafkaError | None = None) -> None:
        """Drop the open transaction and everything staged; rewind to committed offsets."""
        # ERROR when state cannot be persisted; nothing of the batch applies.
        log.error("state not persisted, transaction aborted (%s); deciding again", why)
        if is_record_error(error):
            self.quarantine.refused(
                {
                    p: (first, self._positions.get(p, first + 1))
                    for p, first in self._batch_first.items()
                },
                why,
            )
        self._to_log.clear()
        assert self.producer is not None
        abort_transaction(self.producer)
        self._txn_open = False
        for store in self.stores.values():
            store.discard_staged()
        self._rewind(list(self.stores))
        self._reset_batch()
        self.metrics.aborted()
        self.stats.aborts += 1

    def _reset_batch(self) -> None:
        self._positions.clear()
        self._batch_first.clear()
        self._delivered.clear()
        self._delivery_error = None
        self._pending = 0

    def _rewind(self, partitions: list[int]) -> None:
        if not partitions or self.consumer is None:
            return
        committed = self.consumer.committed(
            [TopicPartition(self.topics.proposals, p) for p in partitions], timeout=30
        )
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            try:
                self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            except KafkaException as exc:  # not yet fetching: the committed offset applies
                log.debug("seek %s: %s", tp, exc)

    # -- rebalancing -----------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assigned = sorted(tp.partition for tp in partitions)
        if not assigned:
            return
        new = {p: PartitionStore(self.state_dir.partition(p)) for p in assigned}
        self.metrics.restoring.set(1)
        try:
            restored = restore_partitions(self.config.kafka, self.topics, new)
            for store in new.values():
                store.state_counts()  # counted here, not in the first scrape
        finally:
            self.metrics.restoring.set(0)
        self.metrics.restored.inc(restored)
        self.stats.restored_records += restored
        with self.stores_lock:
            self.stores.update(new)
        log.info("assigned partitions %s (now %s)", assigned, sorted(self.stores))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Commit what was processed while the generation is still valid, then let go.
        self._checkpoint()
        self._drop([tp.partition for tp in partitions])

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another worker owns them already: our open transaction must not commit.
        if self._txn_open:
            self._abort("partitions lost")
        self._drop([tp.partition for tp in partitions])

    def _drop(self, partitions: list[int]) -> None:
        with self.stores_lock:
            for p in partitions:
                store = self.stores.pop(p, None)
                if store is not None:
                    store.close()
                self._positions.pop(p, None)
                self._batch_first.pop(p, None)
                self._lag.pop(p, None)
        if partitions:
            log.info("released partitions %s (now %s)", sorted(partitions), sorted(self.stores))

    # -- queries (HTTP threads) -------------------------------------------------
    def owner_store(self, partition: int) -> PartitionStore | None:
        return self.stores.get(partition)


def timer_proposal_id(run_id: str, timer: Timer) -> str:
    """The id of a deadline's proposal. Deterministic: were it ever sent twice, the second
    would be a `duplicate`. It names the run, so it is unique across runs too (tools key
    outcomes by it); a run id too long for the id's 128 bytes is named by its SHA-256
    (seen: a long run id made the punctuator fail on every tick)."""
    readable = f"timer:{run_id}:{timer.revision}:{timer.name}"
    if len(readable.encode()) <= MAX_PROPOSAL_ID_BYTES:
        return readable
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:32]
    return f"timer:{digest}:{timer.revision}:{timer.name}"


def assignment_strategy(static_membership: bool) -> str:
    """Cooperative rebalancing moves partitions in two rounds: the owner gives them up,
    then rejoins so they can go elsewhere. A static member killed between the two is
    replaced without a rebalance (its restart rejoins a stable group), so nobody rejoins
    and the partitions it gave up stay unowned until the membership changes again (seen
    in the fault harness: two of three partitions idle for minutes). Eager rebalancing
    hands out the whole assignment in one round, so static members use it."""
    return "roundrobin" if static_membership else "cooperative-sticky"


def abort_transaction(producer: Producer, attempts: int = 3, timeout_s: float = 10.0) -> None:
    """Abort the open transaction. An abort that times out says "retry call to resume"
    and stays in progress: it is called again (found by the broker-restart scenario: left
    in progress, the next begin_transaction failed _CONFLICT and ended the worker). Still
    not aborted, or fatal: ClientBroken, and the worker restarts in place."""
    for _ in range(attempts):
        try:
            bounded("abort_transaction", lambda: producer.abort_transaction(timeout_s), timeout_s)
            return
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal():
                raise ClientBroken(f"the producer cannot abort: {exc}") from exc
            if not error.retriable():  # e.g. nothing to abort any more
                log.warning("abort_transaction: %s", exc)
                return
            log.warning("abort_transaction did not finish (%s); calling it again", exc)
    raise ClientBroken(f"the transaction was not aborted after {attempts} attempts")


def default_state_dir() -> Path:
    return Path(os.environ.get("RUNSTATE_STATE_DIR", "./state"))
