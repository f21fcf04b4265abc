"""The same engine as a faust-streaming app: a Faust agent decides each proposal and
keeps snapshots in a Faust Table on the rocksdict driver, changelogged to the same
`runs-changelog` topic; outcomes go to the same topics in the same formats.

Faust writes a table through to RocksDB and its changelog before the input offset is
committed, so it cannot give the native worker's exactly-once. What it gives instead
(docs/runtimes.md, Guarantees per runtime), by three rules:
  - each outcome is acknowledged by the broker before the next proposal is decided; a
    commit's transition before its changelog record, and both before the table's store
    is written: no outcome is lost, and a transition sent again is the same record;
  - the agent, not Faust, owns the proposals' positions (`positions`): Faust drops
    fetched records around a rebalance, so a gap makes the agent seek back, and only
    offsets the agent has answered are committed;
  - a proposal already answered (below the local mark, or at or below the latest
    commit restored from the changelog, `table`) is not decided again; any other is
    decided against the snapshot it saw the first time and gets the same outcome, so
    the state never moves twice for one proposal id.
Deadlines and alerts fire through the native worker's punctuator (`timers`), at least
once: each is marked fired in the table and its changelog once its record is delivered.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import faust
from faust.types import TP

from processor.engine import Beat, Commit, Forget
from processor.engine.answers import Answer, committed_digest
from processor.kafka.config import WorkerConfig
from processor.observe.logs import log_outcomes, logged
from processor.observe.metrics import MetricsBatch
from processor.records.intake import TimestampType
from processor.records.outputs import (
    UNLIMITED,
    CommitLimits,
    OutputRecord,
    RecordLimits,
    Source,
    answer_changelog_key,
    answers_changelog_prefix,
    publishable,
)
from processor.records.pipeline import (
    DeadLetterReason,
    Outcome,
    Placement,
    decide_record,
    outcome_run_id,
)
from processor.records.punctuator import Punctuator, timer_key
from processor.records.stats import OutcomeStats
from processor.runtimes.faust import datadir_of
from processor.runtimes.faust.kafka import faust_kafka_settings
from processor.runtimes.faust.observe import StateIndex, faust_metrics
from processor.runtimes.faust.positions import Positions, Verdict
from processor.runtimes.faust.table import (
    NEXT_OFFSET_KEY,
    SOURCE_OFFSET_HEADER,
    RunsTable,
    proposal_key,
    proposals_prefix,
)
from processor.runtimes.faust.timers import DueIndex, TableTimers
from processor.runtimes.faust.transport import Consumer, Transport, Unreadable
from processor.runtimes.faust.web import FaustNode, Web, serve_api
from processor.runtimes.native.preflight import batch_size
from processor.serving.peers import client_id
from processor.serving.read_fence import ReadFence
from processor.trust.keyring import KeyringWatch
from schemas.messages import Proposal, Rejection, RunSnapshot

log = logging.getLogger("runstate.faust")

#: aiokafka's default batch size (Faust's `producer_max_batch_size`).
FAUST_BATCH_SIZE = 16_384


@dataclass
class FaustStats(OutcomeStats):
    skipped: int = 0  # decided before a crash, outcome already delivered


class App(faust.App):
    """A Faust app whose consumer starts never-committed partitions from the
    beginning after every seek (see `transport`), and whose web server serves runstate's
    API alone (see `web`)."""

    def _new_transport(self) -> Transport:
        return Transport(self.conf.broker_consumer, self)

    def _new_web(self) -> Web:
        return Web(self)


def build_app(
    config: WorkerConfig,
    partitions: int,
    http_port: int,
    advertised_url: str | None = None,
    limits: RecordLimits = UNLIMITED,
) -> faust.App:
    """`limits`: what each topic takes (`preflight.learn_limits`)."""
    topics = config.topics
    commit_limits = CommitLimits(topics, limits)
    datadir = datadir_of(config)
    datadir.mkdir(parents=True, exist_ok=True)
    kafka: dict[str, Any] = {
        # The native worker's failover time (Faust's default is 60 s).
        "broker_session_timeout": 10.0,
        "broker_heartbeat_interval": 2.0,
        # The user's -X settings, as Faust's (every one has an equivalent or is refused).
        **faust_kafka_settings(config.kafka.client_config),
        # No batch larger than a topic written takes (the broker refuses it whole).
        "producer_max_batch_size": batch_size(config.kafka, limits, FAUST_BATCH_SIZE),
    }
    if advertised_url:  # in the group's description, where other workers find this one
        kafka["broker_client_id"] = client_id(advertised_url)
    app = App(
        config.group_id,
        broker=[f"kafka://{b}" for b in config.kafka.bootstrap_servers.split(",")],
        store="rocksdb://",
        processing_guarantee="at_least_once",
        datadir=str(datadir),
        topic_partitions=partitions,
        topic_disable_leader=True,
        topic_allow_declare=False,  # runstate's topics exist (runstate topics create)
        consumer_auto_offset_reset="earliest",
        # Faust commits offsets on a timer; below about a second it overlaps itself.
        broker_commit_interval=max(1.0, config.commit_interval_ms / 1000),
        web_enabled=True,
        web_bind=config.http_host,
        web_port=http_port,
        web_in_thread=False,
        key_serializer="raw",
        value_serializer="raw",
        **kafka,
    )
    # Raw bytes everywhere (app-wide serializers): the same wire format as the native worker.
    # Faust's acknowledgements off: it acknowledges records it skipped around a
    # rebalance; the agent commits the offsets it vouches for instead (`positions`).
    proposals = app.topic(topics.proposals, acks=False)
    transitions = app.topic(topics.transitions)
    rejections = app.topic(topics.rejections)
    dlq = app.topic(topics.dlq)
    changelog = app.topic(topics.changelog, partitions=partitions)
    alerts = app.topic(topics.alerts)
    heartbeats = app.topic(topics.heartbeats)
    outputs = {
        topics.proposals: proposals,  # deadlines that fell due
        topics.alerts: alerts,
        topics.heartbeats: heartbeats,
        topics.transitions: transitions,
        topics.rejections: rejections,
        topics.dlq: dlq,
        topics.changelog: changelog,
    }
    runs = RunsTable(
        app,
        name="runs",
        default=None,
        beacon=app.tables.beacon,
        partitions=partitions,
        changelog_topic=changelog,
        key_type=bytes,
        value_type=bytes,
        options={"driver": "rocksdict"},
    )
    app.tables.add(runs)
    positions = Positions()

    def consumer() -> Consumer:
        return cast(Consumer, app.consumer)

    consumer().agent_owned.add(topics.proposals)

    marks_read: set[int] = set()

    def verdict(message: Any) -> Verdict:
        """What to do with this record (see `positions`), from every floor known."""
        partition = message.partition
        if partition not in marks_read:  # the local mark, once per partition
            mark = runs.data.get(NEXT_OFFSET_KEY)
            if mark is not None:
                positions.learn(partition, int(mark))
            marks_read.add(partition)
        restored = runs.latest_commit.get(partition)
        if restored is not None:
            positions.learn(partition, restored + 1)
        floor = consumer().floors.get(message.tp)
        if floor is not None:
            positions.learn(partition, floor)
        if not positions.known(partition):
            return Verdict.WAIT  # read before Faust sought this partition
        return positions.classify(partition, message.offset, message.generation_id)

    def delivered(message: Any, last: int) -> None:
        """The outcome of every offset of `message` up to `last` is delivered."""
        positions.decided(message.partition, last)
        runs.data[NEXT_OFFSET_KEY] = str(last + 1).encode()

    @app.timer(interval=max(1.0, config.commit_interval_ms / 1000))  # type: ignore[untyped-decorator]
    async def commit_positions() -> None:
        owned_tps = [tp for tp in app.assignor.assigned_actives() if tp.topic == topics.proposals]
        offsets = {
            tp: positions.next[tp.partition] for tp in owned_tps if positions.known(tp.partition)
        }
        if offsets and not app.rebalancing:
            await consumer().commit_positions(offsets)

    stats = FaustStats()
    read_fence = ReadFence()
    punctuator = Punctuator(
        topics,
        timer_key(config.keyring, config.timer_key_id, config.timer_key_file),
        config.keyring,
    )

    def relay(proposal: Proposal) -> OutputRecord:
        """A message to another run, signed now (the record's time must be fresh)."""
        return punctuator.relay(proposal, int(time.time() * 1000), partitions)

    keyring = KeyringWatch(config.keyring, config.keyring_file)
    due_index = DueIndex()

    @app.timer(interval=config.timer_interval_ms / 1000)  # type: ignore[untyped-decorator]
    async def fire_timers() -> None:
        """Every due timer of the partitions this worker owns, fired once (`timers`)."""
        node.last_turn = time.monotonic()  # the loop turns (GET /livez)
        if app.rebalancing or app.in_recovery:
            return
        if node.indexed_recoveries != runs.recoveries:  # partitions restored: re-read
            due_index.forget()
            run_states.forget()
            node.indexed_recoveries = runs.recoveries
        now_ms = int(time.time() * 1000)
        owned_now = owned()
        for partition in range(partitions):
            if partition not in owned_now or not runs.holds(partition):
                due_index.forget(partition)
                run_states.forget(partition)
                continue
            if not due_index.indexed(partition):
                # one scan of the table for both indexes
                where = due_index.rebuild(partition, runs.partition_items(partition))
                run_states.rebuild(partition, where)
                count = due_index.size(partition)
                log.info("partition %d: %d runs with timers indexed", partition, count)
            due = due_index.due_runs(partition, now_ms)
            if not due:
                continue
            state = TableTimers(runs, partition)
            try:
                await fire_due(partition, now_ms, state, due)
            except Exception:
                # Those not marked fire at the next tick: the index is read again.
                log.exception("firing timers of partition %d failed; trying again", partition)
                due_index.forget(partition)

    async def fire_due(partition: int, now_ms: int, state: TableTimers, due: list[str]) -> None:
        for firing in punctuator.fire(now_ms, state, due):
            # Each record acknowledged before the next: the proposal or alert, then the
            # mark; the mark reaches the table last.
            for record in firing.records:
                sent = await outputs[record.topic].send(
                    key=record.key,
                    value=record.value,
                    partition=partition,
                    headers=cast(Any, record.headers),
                )
                await sent
            state.persist(firing.snapshot.run_id)
            firing.log()
            stats.fired(firing)
            if not firing.is_deadline:
                metrics.alerts.labels(firing.snapshot.machine, firing.timer.name).inc()

    def snapshot_of(run_id: str) -> RunSnapshot | None:
        raw_value = runs.get(run_id.encode())
        return None if raw_value is None else RunSnapshot.model_validate_json(raw_value)

    def lag() -> dict[int, int]:
        """Records behind per owned partition: the partition's end minus `next`, for the
        partitions whose end aiokafka knows (once a fetch returned records of them)."""
        behind: dict[int, int] = {}
        for partition in owned():
            if not positions.known(partition):
                continue
            try:
                end = consumer().highwater(TP(topics.proposals, partition))
            except Exception:  # no fetch yet
                continue
            if end is not None and end >= 0:
                behind[partition] = max(0, end - positions.next[partition])
        return behind

    run_states = StateIndex()
    metrics = faust_metrics(config.machines, run_states, lambda: owned(), lag)
    metrics.restoring.set_function(lambda: 1.0 if app.in_recovery else 0.0)
    runs.on_restored = metrics.restored.inc

    @app.agent(proposals, name="decide")
    async def decide_proposals(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            seen: dict[str, RunSnapshot | None] = {}

            def looked_up(run_id: str, seen: dict[str, RunSnapshot | None] = seen) -> Any:
                """The run as the engine saw it (kept: the metrics' previous state)."""
                if run_id not in seen:
                    seen[run_id] = snapshot_of(run_id)
                return seen[run_id]

            action = verdict(message)
            if action is Verdict.SKIP:
                stats.skipped += 1
                continue
            if action is Verdict.SEEK:
                log.warning(
                    "%s: records before offset %d were dropped by Faust; seeking back to %d",
                    message.tp,
                    message.offset,
                    positions.next[message.partition],
                )
                await consumer().seek(message.tp, positions.next[message.partition])
                continue
            if action is Verdict.WAIT:
                continue
            at_ms = round(message.timestamp * 1000)
            # A batch the consumer could not read (`transport`): one DLQ record for it,
            # naming its offsets and the reason; the partition goes on after it.
            unreadable = message.checksum if isinstance(message.checksum, Unreadable) else None
            last = message.offset if unreadable is None else unreadable.last
            outcome: Outcome
            try:
                if unreadable is not None:
                    outcome = DeadLetterReason(unreadable.reason)
                else:
                    began = time.perf_counter()
                    outcome = decide_record(
                        message.key,
                        message.value,
                        message.headers,
                        at_ms,
                        topic=topics.proposals,
                        keyring=keyring.current(),
                        machines=config.machines,
                        lookup=looked_up,
                        seen=partial(committed_by, message.partition, looked_up),
                        placement=Placement(message.partition, partitions),
                        max_bytes=config.max_proposal_bytes,
                        max_state_bytes=config.max_state_bytes,
                        timestamp_type=TimestampType.of_kafka(message.timestamp_type),
                        commit_limits=commit_limits,
                        relays=punctuator.relays,
                    )
                    metrics.decision.observe(time.perf_counter() - began)
            except Exception as exc:  # a bug must not stall the partition
                log.exception("deciding %s@%s failed", message.partition, message.offset)
                outcome = DeadLetterReason(f"internal error while deciding: {exc!r}")
            partition = message.partition
            source = Source(
                message.topic, partition, message.offset, message.key, message.value, at_ms
            )
            outcome, records = publishable(topics, outcome, source, limits, relay=relay)
            # Each record delivered (awaited) before the next, the transition before its
            # snapshot, and all before the offset can be committed. Faust's own
            # `runs[key] = ...` sends the changelog record whenever its buffer drains,
            # possibly after the offset is committed; a crash there lost the record, and
            # recovery replayed older ones over the newer store.
            run_id = outcome_run_id(outcome)
            previous = looked_up(run_id) if run_id else None
            # This runtime's own changelog records go before the run's snapshot (or
            # tombstone), which is always last: only that one names the proposal's offset
            # (SOURCE_OFFSET_HEADER), so a crash before it decides the proposal again,
            # and one after it finds everything written.
            own: list[OutputRecord] = []
            if isinstance(outcome, Commit):  # dedupe for the run's life
                t = outcome.transition
                answer = f"{t.revision} {committed_digest(t)}".encode()
                own.append(
                    OutputRecord(topics.changelog, proposal_key(t.run_id, t.proposal_id), answer)
                )
            elif isinstance(outcome, Forget):  # its proposal ids and answers go with it
                run_id = outcome.transition.run_id
                own += [
                    OutputRecord(topics.changelog, key, None)
                    for prefix in (proposals_prefix(run_id), answers_changelog_prefix(run_id))
                    for key in runs.partition_keys(partition, prefix)
                ]
            if own:
                records = [*records[:-1], *own, records[-1]]
            sending = time.perf_counter()
            # From the first output sent until the table has the outcome, a reader
            # who saw that output waits for it (read_fence.py).
            fenced = read_fence.open()
            try:
                snapshot: OutputRecord | None = None
                for n, record in enumerate(records):
                    headers = None
                    if record.topic == topics.changelog and n == len(records) - 1:
                        snapshot = record
                        headers = [(SOURCE_OFFSET_HEADER, str(message.offset).encode())]
                    elif record.partition is not None:  # a message to another run, signed
                        headers = cast(Any, record.headers)
                    sent = await outputs[record.topic].send(
                        key=record.key,
                        value=record.value,
                        partition=partition if record.partition is None else record.partition,
                        headers=headers,
                    )
                    await sent
                for record in own:
                    if record.value is not None:
                        runs.data[record.key] = record.value
                # The mark before the snapshot: a crash between them leaves the snapshot to
                # recovery, which replays every changelog record since the last one.
                delivered(message, last)
                if isinstance(outcome, Forget):
                    for record in records:
                        if record.topic == topics.changelog:
                            runs.data.pop(record.key, None)
                    due_index.drop(partition, outcome.transition.run_id)
                    if previous is not None:
                        run_states.drop(partition, previous)
                elif snapshot is not None:
                    runs.data[snapshot.key] = snapshot.value
                    if isinstance(outcome, Commit | Beat):
                        due_index.note(partition, outcome.snapshot)
                        run_states.note(partition, previous, outcome.snapshot)
            finally:
                read_fence.close(fenced)
            stats.count(outcome)
            # Counted once acknowledged (this runtime's commit), one proposal at a time.
            observed = MetricsBatch()
            observed.stage(previous, outcome)
            metrics.committed(observed, time.perf_counter() - sending, 1)
            if logged(outcome):
                log_outcomes([outcome])  # acknowledged, at its level (logs.py)

    def committed_by(
        partition: int,
        current: Callable[[str], RunSnapshot | None],
        run_id: str,
        proposal_id: str,
    ) -> Answer | None:
        """What the run answered `proposal_id`, for the run's life: the refusal it
        remembers, or the revision that committed it. A revision past
        the run's own is not a commit of it: an outcome's proposal-id record goes to the
        changelog before its snapshot (not in one transaction), and a crash between the
        two left the id recorded and the run unmoved. Taken as a commit, the proposal was
        refused `duplicate` when decided again, the run never took it, and the next
        proposal got its revision: two different transitions with one id (CI, SIGKILL)."""
        refused = runs.partition_get(partition, answer_changelog_key(run_id, proposal_id))
        if refused is not None:
            rejection = Rejection.model_validate_json(refused)
            return Answer(None, rejection.content_digest, rejection)
        raw = runs.partition_get(partition, proposal_key(run_id, proposal_id))
        if raw is None:
            return None
        revision, _, digest = bytes(raw).partition(b" ")
        run = current(run_id)
        if run is None or int(revision) > run.revision:
            return None
        return Answer(int(revision), digest.decode() or None)

    def owned() -> list[int]:
        return sorted(
            tp.partition for tp in app.assignor.assigned_actives() if tp.topic == topics.proposals
        )

    node = FaustNode(
        app=app,
        config=config,
        partitions=partitions,
        runs=runs,
        due_index=due_index,
        states=run_states,
        metrics=metrics,
        stats=stats,
        owned=owned,
        advertised_url=advertised_url,
        read_fence=read_fence,
    )
    serve_api(app, node)  # the same HTTP API as the native worker's (processor/serving/api.py)
    return app
