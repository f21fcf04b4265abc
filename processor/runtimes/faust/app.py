"""The same engine as a faust-streaming app: a Faust agent decides each proposal and
keeps snapshots in a Faust Table on the rocksdict driver, changelogged to the same
`runs-changelog` topic; outcomes go to the same topics in the same formats.

Faust writes a table through to RocksDB and its changelog before the input offset is
committed, so it cannot give the native worker's exactly-once. What it gives instead
(docs/runtimes.md, Guarantees per runtime), by three rules:
  - the agent decides a batch of proposals (each against the snapshots the ones before
    it left), then delivers their outcomes in two phases, each sent at once and
    acknowledged whole by the broker: every record but the snapshots (transitions,
    rejections, DLQ records, dedupe records), then the snapshots; the table's store is
    written only after both: no outcome is lost, and a transition sent again is the same
    record; the next batch is decided while one travels, and its snapshots go only once
    that one is written (inflight.py);
  - the agent, not Faust, owns the proposals' positions (`positions`): Faust drops
    fetched records around a rebalance, so a gap makes the agent seek back, and only
    offsets the agent has answered are committed;
  - a proposal already answered (below the local mark, or at or below the latest
    commit restored from the changelog, `table`) is not decided again; any other is
    decided against the snapshot it saw the first time and gets the same outcome, so
    the state never moves twice for one proposal id;
  - a partition's proposals are decided only while this worker holds its store: Faust
    drops it when the partition is revoked or the worker stops, and a store opened
    again then would lack the writes skipped meanwhile (a proposal decided against it
    could be refused differently from its first answer). Before partitions leave, the
    batch being decided is finished and its offsets committed (`App.handover`).
Deadlines and alerts fire through the native worker's punctuator (`timers`), at least
once: each is marked fired in the table and its changelog once its record is delivered.

`FaustWorker` builds the app, holds the state and registers the agent and the timers;
each job is a part of its own:
- `Decision` (processing.py): a batch of proposals decided, their outcomes delivered, then
  written to the table, in the order the rules above need;
- `OutputProducer` (producer.py): every output record produced (librdkafka), a batch at
  a time, for the decisions and the timers alike;
- `TimerTick` (timers.py): due timers fired, every `timer_interval_ms`;
- `Positions` (positions.py): the offsets the agent vouches for, read and written by the
  worker's `verdict`, `delivered` and `commit_positions`;
- `RunsTable` (table.py), `DueIndex` (timers.py), `StateIndex` (observe.py): the runs by
  id, by due time and by state;
- `FaustNode` (web.py): what the HTTP API asks of the runtime.
"""

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import faust
from faust.types import TP

from processor.observe.stacks import dump_stacks_on
from processor.records.limits import DEFAULT_BATCH_SIZE, UNLIMITED, RecordLimits
from processor.records.punctuator import Punctuator, timer_key
from processor.records.stats import OutcomeStats
from processor.runtimes.faust import datadir_of
from processor.runtimes.faust.inflight import InFlight
from processor.runtimes.faust.kafka import faust_kafka_settings
from processor.runtimes.faust.observe import StateIndex, faust_metrics
from processor.runtimes.faust.positions import Positions, Verdict
from processor.runtimes.faust.processing import Decision, last_offset
from processor.runtimes.faust.producer import OutputProducer
from processor.runtimes.faust.table import NEXT_OFFSET_KEY, RunsTable
from processor.runtimes.faust.timers import DueIndex, TimerTick
from processor.runtimes.faust.transport import Consumer, Transport
from processor.runtimes.faust.web import FaustNode, Web, serve_api
from processor.runtimes.native.preflight import batch_size
from processor.runtimes.settings import WorkerConfig
from processor.serving.peers import client_id
from processor.serving.read_fence import ReadFence
from processor.trust.keyring import KeyringWatch

log = logging.getLogger("runstate.faust")

#: aiokafka's default batch size (Faust's `producer_max_batch_size`).
FAUST_BATCH_SIZE = 16_384
#: Proposals decided together at most.
DECIDE_BATCH = 500
#: How long a graceful stop, or a rebalance taking partitions away, waits for the batch
#: being decided and the commit of the answered offsets.
HANDOVER_COMMIT_S = 5.0


@dataclass
class FaustStats(OutcomeStats):
    skipped: int = 0  # decided before a crash, outcome already delivered


class App(faust.App):
    """A Faust app whose consumer starts never-committed partitions from the
    beginning after every seek (see `transport`), whose web server serves runstate's
    API alone (see `web`), and which hands partitions over through `handover`."""

    #: Awaited before partitions leave this worker (a rebalance revoking them, or a
    #: stop): the flow of records has stopped, their stores are still held (Faust drops
    #: them next) and the consumer is still a member of the group.
    handover: Callable[[], Awaitable[None]] | None = None

    async def _consumer_wait_empty(self, consumer: Any, logger: Any) -> None:
        await super()._consumer_wait_empty(consumer, logger)
        if self.handover is not None:
            await self.handover()

    def _new_transport(self) -> Transport:
        return Transport(self.conf.broker_consumer, self)

    def _new_web(self) -> Web:
        return Web(self)


def new_app(
    config: WorkerConfig,
    partitions: int,
    http_port: int,
    advertised_url: str | None,
    limits: RecordLimits,
    datadir: Path,
) -> App:
    """The Faust app with this runtime's settings: no topics, tables, agents or timers yet."""
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
    return App(
        config.settings.group_id,
        broker=[f"kafka://{b}" for b in config.kafka.bootstrap_servers.split(",")],
        store="rocksdb://",
        processing_guarantee="at_least_once",
        datadir=str(datadir),
        topic_partitions=partitions,
        topic_disable_leader=True,
        topic_allow_declare=False,  # runstate's topics exist (runstate topics create)
        consumer_auto_offset_reset="earliest",
        # Faust commits offsets on a timer; below about a second it overlaps itself.
        broker_commit_interval=max(1.0, config.settings.commit_interval_ms / 1000),
        web_enabled=True,
        web_bind=config.settings.http_host,
        web_port=http_port,
        web_in_thread=False,
        key_serializer="raw",
        value_serializer="raw",
        **kafka,
    )


class FaustWorker:
    """The Faust runtime: `app` is what Faust's worker runs."""

    def __init__(
        self,
        config: WorkerConfig,
        partitions: int,
        http_port: int,
        advertised_url: str | None = None,
        limits: RecordLimits = UNLIMITED,
    ) -> None:
        """`limits`: what each topic takes (`preflight.learn_limits`)."""
        self.config = config
        self.partitions = partitions
        self.topics = topics = config.topics
        datadir = datadir_of(config)
        datadir.mkdir(parents=True, exist_ok=True)
        self.app = app = new_app(config, partitions, http_port, advertised_url, limits, datadir)
        # Raw bytes everywhere (app-wide serializers): the same wire format as the native worker.
        # Faust's acknowledgements off: it acknowledges records it skipped around a
        # rebalance; the agent commits the offsets it vouches for instead (`positions`).
        self.proposals = proposals = app.topic(topics.proposals, acks=False)
        changelog = app.topic(topics.changelog, partitions=partitions)
        # Every output (the changelog's records too) goes through librdkafka (producer.py).
        self.producer = OutputProducer(
            config.kafka, batch_size(config.kafka, limits, DEFAULT_BATCH_SIZE)
        )
        self.runs = runs = RunsTable(
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
        self.positions = Positions()
        self.consumer().agent_owned.add(topics.proposals)
        self.consumer().refetch = self.seek_to_positions
        self.marks_read: set[int] = set()  # partitions whose local mark was read
        self.stats = FaustStats()
        self.read_fence = ReadFence()
        self.punctuator = Punctuator(
            topics,
            timer_key(config.keyring, config.settings.timer_key_id, config.settings.timer_key_file),
            config.keyring,
        )
        self.keyring = KeyringWatch(config.keyring, config.settings.keyring_file)
        self.due_index = DueIndex()
        self.run_states = StateIndex()
        self.metrics = faust_metrics(config.machines, self.run_states, self.owned, self.lag)
        self.metrics.restoring.set_function(lambda: 1.0 if app.in_recovery else 0.0)
        runs.on_restored = self.metrics.restored.inc
        self.node = FaustNode(
            app=app,
            config=config,
            partitions=partitions,
            runs=runs,
            due_index=self.due_index,
            states=self.run_states,
            metrics=self.metrics,
            stats=self.stats,
            owned=self.owned,
            advertised_url=advertised_url,
            read_fence=self.read_fence,
        )
        self.decision = Decision(
            config=config,
            partitions=partitions,
            limits=limits,
            runs=runs,
            deliver=self.producer.deliver,
            punctuator=self.punctuator,
            keyring=self.keyring,
            metrics=self.metrics,
            stats=self.stats,
            due_index=self.due_index,
            run_states=self.run_states,
            read_fence=self.read_fence,
            delivered=self.delivered,
        )
        self.tick = TimerTick(
            app=app,
            partitions=partitions,
            runs=runs,
            due_index=self.due_index,
            run_states=self.run_states,
            punctuator=self.punctuator,
            deliver=self.producer.deliver,
            stats=self.stats,
            metrics=self.metrics,
            owned=self.owned,
            node=self.node,
        )
        # Faust runs the timers and the agent; each delegates to a method or a part.
        app.timer(interval=max(1.0, config.settings.commit_interval_ms / 1000))(
            self.commit_positions
        )
        app.timer(interval=config.settings.timer_interval_ms / 1000)(self.tick.fire_timers)
        self.inflight = InFlight()  # batches whose outcomes travel
        self.idle = asyncio.Event()  # no batch being decided or travelling
        self.idle.set()
        self.handovers = 0  # handovers waiting for the agent to be idle
        app.handover = self.commit_positions_at_handover
        app.agent(proposals, name="decide")(self.decide_proposals)
        # The same HTTP API as the native worker's (processor/serving/api.py).
        serve_api(app, self.node)

    def consumer(self) -> Consumer:
        return cast(Consumer, self.app.consumer)

    async def decide_proposals(self, stream: Any) -> None:
        """The agent: the proposals `positions` says are next, decided a batch at a time:
        every record its channel holds when it looks, up to `DECIDE_BATCH`; it waits for
        the first only. While a batch's outcomes travel, the next batch is decided
        (inflight.py); with nothing more to decide, or partitions about to leave, what
        travels is finished first.

        It reads the stream's channel, not the stream: Faust's iteration of a stream
        returns to the event loop before each record, and its `take_events` cuts a batch
        when a timer fires: under a backlog, batches of about 150 of 500 (refilling takes
        longer than the timer's 5 ms), and at a trickle that wait on every answer. What
        the stream adds per record is not needed here: the topic is not acknowledged
        (`acks=False`), and `verdict` places every record by its offset, a record of an
        older generation or of a partition gone included."""
        channel = aiter(stream.channel)  # registered with Faust's conductor: subscribed
        queue = channel.queue
        try:
            while True:
                if self.inflight.busy and (queue.empty() or self.handing_over):
                    await self.inflight.drain()
                if not self.inflight.busy:
                    self.positions.release()
                    self.idle.set()
                try:
                    events = [await channel.get()]
                    while len(events) < DECIDE_BATCH and not queue.empty():
                        events.append(queue.get_nowait())  # (raises what was thrown to it)
                except StopAsyncIteration:
                    # Faust ends an agent's iteration so when it stops the agent. What
                    # was taken is not answered: its offsets are not committed, it comes
                    # again (what travels was finished at the handover before).
                    return
                self.idle.clear()
                await self.decide_events(events)
        finally:
            await self.inflight.abandon()
            self.positions.release()
            self.idle.set()

    async def decide_events(self, events: Sequence[Any]) -> None:
        batch: list[Any] = []
        for event in events:
            message = event.message
            action = self.verdict(message)
            if action is Verdict.SKIP:
                self.stats.skipped += 1
                continue
            if action is Verdict.SEEK:
                # What came before the gap, first, and delivered: `next` is then known.
                await self.submit(batch)
                await self.inflight.drain()
                batch = []
                log.warning(
                    "%s: records before offset %d were dropped by Faust; seeking back to %d",
                    message.tp,
                    message.offset,
                    self.positions.next[message.partition],
                )
                await self.consumer().seek(message.tp, self.positions.next[message.partition])
                continue
            if action is Verdict.WAIT:
                continue
            batch.append(message)
            self.positions.take(message.partition, last_offset(message))
        await self.submit(batch)

    async def submit(self, messages: Sequence[Any]) -> None:
        """Decide `messages` now and start delivering their outcomes."""
        await self.inflight.room()
        batch = self.decision.prepare_batch(messages)
        if batch is not None:
            self.inflight.add(self.decision.complete(batch, self.inflight.last))

    def verdict(self, message: Any) -> Verdict:
        """What to do with this record (see `positions`), from every floor known."""
        positions = self.positions
        partition = message.partition
        if not self.runs.holds(partition):
            return Verdict.WAIT  # revoked, or stopping: the next owner's to decide
        if partition not in self.marks_read:  # the local mark, once per partition
            mark = self.runs.partition_read(partition, NEXT_OFFSET_KEY)
            if mark is not None:
                positions.learn(partition, int(mark))
            self.marks_read.add(partition)
        restored = self.runs.latest_commit.get(partition)
        if restored is not None:
            positions.learn(partition, restored + 1)
        floor = self.consumer().floors.get(message.tp)
        if floor is not None:
            positions.learn(partition, floor)
        if not positions.known(partition):
            return Verdict.WAIT  # read before Faust sought this partition
        return positions.classify(partition, message.offset, message.generation_id)

    def delivered(self, message: Any, last: int) -> None:
        """The outcome of every offset of `message` up to `last` is delivered (and the
        table's mark says so)."""
        self.positions.decided(message.partition, last)

    async def seek_to_positions(self) -> None:
        """Every owned partition read again from the offset the agent vouches for (after
        a fetch failed: records it had taken from the consumer are lost)."""
        for partition in self.owned():
            if self.positions.known(partition):
                tp = TP(self.topics.proposals, partition)
                await self.consumer().seek(tp, self.positions.next[partition])

    def answered_offsets(self) -> dict[TP, int]:
        """Per owned proposals partition, the offset the agent vouches for: never below
        where the partition started at its latest assignment (the group's committed
        offset then), which another worker may have raised while it was away."""
        floors = self.consumer().floors
        return {
            tp: max(self.positions.next[tp.partition], floors.get(tp, 0))
            for tp in self.app.assignor.assigned_actives()
            if tp.topic == self.topics.proposals and self.positions.known(tp.partition)
        }

    async def commit_positions(self) -> None:
        """The offsets the agent vouches for, committed (every `commit_interval_ms`)."""
        offsets = self.answered_offsets()
        if offsets and not self.app.rebalancing:
            await self.consumer().commit_positions(offsets)

    async def commit_positions_at_handover(self) -> None:
        """Before partitions leave this worker (a graceful stop, a rebalance taking them),
        the batch being decided is finished (written to the stores, which Faust drops
        next) and what was answered since the last periodic commit is committed: the next
        owner would otherwise decide it again."""
        # Bounded: a consumer that has already left the group, or whose thread has
        # stopped, must not hold the stop or the rebalance. The next owner then answers
        # them again, as after a crash.
        try:
            await asyncio.wait_for(self._commit_when_idle(), HANDOVER_COMMIT_S)
        except Exception as exc:
            log.warning("committing the answered offsets at a handover failed: %r", exc)

    @property
    def handing_over(self) -> bool:
        return self.handovers > 0

    async def _commit_when_idle(self) -> None:
        self.handovers += 1  # the agent finishes what travels before deciding more
        try:
            await self.idle.wait()
        finally:
            self.handovers -= 1
        offsets = self.answered_offsets()
        if offsets:
            await self.consumer().commit_positions(offsets)

    def owned(self) -> list[int]:
        return sorted(
            tp.partition
            for tp in self.app.assignor.assigned_actives()
            if tp.topic == self.topics.proposals
        )

    def lag(self) -> dict[int, int]:
        """Records behind per owned partition: the partition's end minus `next`, for the
        partitions whose end aiokafka knows (once a fetch returned records of them)."""
        behind: dict[int, int] = {}
        for partition in self.owned():
            if not self.positions.known(partition):
                continue
            try:
                end = self.consumer().highwater(TP(self.topics.proposals, partition))
            except Exception:  # no fetch yet
                continue
            if end is not None and end >= 0:
                behind[partition] = max(0, end - self.positions.next[partition])
        return behind


class StackDumpingWorker(faust.Worker):
    """Faust's worker, with SIGUSR1 left to `runstate worker`'s stack dump (stacks.py):
    mode's own handler prints the stacks from the event loop, so a worker whose loop is
    stuck, the one that needs it, printed nothing."""

    def _install_signal_handlers_unix(self) -> None:
        super()._install_signal_handlers_unix()
        self.loop.remove_signal_handler(signal.SIGUSR1)  # (which leaves SIG_DFL: death)
        dump_stacks_on(signal.SIGUSR1)
