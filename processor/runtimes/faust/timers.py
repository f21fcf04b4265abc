"""Deadlines and alerts for the Faust runtime, through the native worker's `Punctuator`.

The Faust table has no index of timers by due time, so this runtime keeps one in memory,
per partition (`DueIndex`): built from the partition's table store (one scan of it) the
first time a tick sees the partition after each recovery, and kept up to date by every
commit the agent writes and every mark a tick writes. A tick (every `timer_interval_ms`)
asks the index for the runs with a timer due, and the punctuator fires those timers.

The fired marks live in the table next to the snapshots, under the changelog's own keys
(`FIRED_CHANGELOG_PREFIX` + run id, values `Fired`), so a worker that restores the
partition from the changelog reads them back. Keys that start with NUL are never a
snapshot (run ids cannot start with one): marks and the local offset mark.

Order per firing: the deadline's proposal (or the alert) is acknowledged by the broker,
then the mark, then the mark is written to the table. A crash between the first and the
second fires the timer again after the restart: at least once, like the rest of this
runtime. A repeated deadline is refused (`duplicate` or `revision_conflict`: its proposal
id and expected revision are the same); a repeated alert is a second alert record.

`TimerTick` is the tick; `DueIndex` the index; `TableTimers` the punctuator's view of
one partition of the table.
"""

import heapq
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import faust

from processor.observe.metrics import WorkerMetrics
from processor.records.changelog_keys import FIRED_CHANGELOG_PREFIX
from processor.records.punctuator import NOT_FIRED, Fired, Punctuator
from processor.records.stats import OutcomeStats
from processor.runtimes.faust.observe import Entered, PartitionIndexes, StateIndex
from processor.runtimes.faust.producer import Deliver, sendable
from processor.runtimes.faust.table import RunsTable
from schemas.messages import RunSnapshot

log = logging.getLogger("runstate.faust")

_LOCAL = b"\x00"  # keys that are not a snapshot start with NUL


def fired_key(run_id: str) -> bytes:
    return FIRED_CHANGELOG_PREFIX + run_id.encode()


@dataclass
class _Partition:
    heap: list[tuple[int, str]] = field(default_factory=list)
    dues: dict[str, frozenset[int]] = field(default_factory=dict)  # per run, not yet fired
    live: int = 0  # entries of `dues`, all runs

    def put(self, run_id: str, dues: Iterable[int]) -> None:
        due_set = frozenset(dues)
        self.live -= len(self.dues.pop(run_id, ()))
        if due_set:
            self.dues[run_id] = due_set
            self.live += len(due_set)
            for due in due_set:
                heapq.heappush(self.heap, (due, run_id))
        if len(self.heap) > 4 * self.live + 1024:  # stale entries of runs that moved on
            self.heap = [(d, r) for r, ds in self.dues.items() for d in ds]
            heapq.heapify(self.heap)

    def take(self, run_id: str, due: int) -> bool:
        """Take one due time of a run out; False if the run no longer has it (stale)."""
        dues = self.dues.get(run_id)
        if dues is None or due not in dues:
            return False
        self.live -= 1
        if len(dues) > 1:
            self.dues[run_id] = dues - {due}
        else:
            del self.dues[run_id]
        return True


class DueIndex(PartitionIndexes[_Partition]):
    """Runs by the due times of their timers that have not fired, per partition."""

    def rebuild(self, partition: int, items: Iterable[tuple[bytes, bytes]]) -> list[Entered]:
        """Index a partition from all of its table entries; returns where each run is and
        since when, read in the same scan (for the metrics and GET /runs?state=)."""
        marks: dict[str, Fired] = {}
        timers: dict[str, list[tuple[int, int, str]]] = {}
        runs: list[Entered] = []
        for key, value in items:
            if key.startswith(FIRED_CHANGELOG_PREFIX):
                marks[key[len(FIRED_CHANGELOG_PREFIX) :].decode()] = Fired.decode(value)
            elif key.startswith(_LOCAL) or value is None:
                continue
            else:
                data = json.loads(value)
                entered = int(data.get("entered_state_at_ms") or 0)
                runs.append(
                    Entered(entered, key.decode(), str(data.get("machine")), str(data.get("state")))
                )
                armed = data.get("timers") or []
                if armed:
                    timers[key.decode()] = [
                        (int(t["due_at_ms"]), int(t["revision"]), str(t["name"])) for t in armed
                    ]
        index = self._partitions[partition] = _Partition()
        for run_id, run_timers in timers.items():
            fired = marks.get(run_id, NOT_FIRED)
            index.put(
                run_id, (due for due, rev, name in run_timers if not fired.covers(rev, name, due))
            )
        return runs

    def note(self, partition: int, snapshot: RunSnapshot) -> None:
        """A run's new snapshot (a commit): its timers replace the run's old ones."""
        index = self._partitions.get(partition)
        if index is not None:  # otherwise the rebuild will see it
            index.put(snapshot.run_id, (t.due_at_ms for t in snapshot.timers))

    def drop(self, partition: int, run_id: str) -> None:
        """A run forgotten: no timers of it any more."""
        index = self._partitions.get(partition)
        if index is not None:
            index.put(run_id, ())

    def due_runs(self, partition: int, now_ms: int) -> list[str]:
        """Runs with a timer due at or before `now_ms`, taken out of the index: what the
        punctuator does not fire (a timer already fired, or one of an older revision)
        needs no entry. A run whose firing fails is put back by `forget` + rebuild."""
        index = self._partitions.get(partition)
        if index is None:
            return []
        runs: dict[str, None] = {}
        while index.heap and index.heap[0][0] <= now_ms:
            due, run_id = heapq.heappop(index.heap)
            if index.take(run_id, due):  # else stale: the run moved on
                runs[run_id] = None
        return list(runs)

    def size(self, partition: int) -> int:
        index = self._partitions.get(partition)
        return 0 if index is None else len(index.dues)


class PartitionView(Protocol):
    """How a partition's runs and marks are read and written outside an event (a tick):
    the table's own `get`/`set` look the partition up from the current event."""

    def partition_get(self, partition: int, key: bytes) -> bytes | None: ...

    def partition_put(self, partition: int, key: bytes, value: bytes) -> None: ...


class TableTimers:
    """The punctuator's `TimerState` over one partition of the Faust table: marks staged
    by the punctuator are written with `persist`, once their records are acknowledged."""

    def __init__(self, view: PartitionView, partition: int) -> None:
        self.view = view
        self.partition = partition
        self.staged: dict[str, Fired] = {}

    def snapshot(self, run_id: str) -> RunSnapshot | None:
        raw = self.view.partition_get(self.partition, run_id.encode())
        return None if raw is None else RunSnapshot.model_validate_json(raw)

    def fired(self, run_id: str) -> Fired:
        staged = self.staged.get(run_id)
        if staged is not None:
            return staged
        raw = self.view.partition_get(self.partition, fired_key(run_id))
        return NOT_FIRED if raw is None else Fired.decode(raw)

    def stage_fired(self, run_id: str, revision: int, name: str, due_ms: int) -> Fired:
        marks = self.fired(run_id).with_name(revision, name, due_ms)
        self.staged[run_id] = marks
        return marks

    def persist(self, run_id: str) -> None:
        marks = self.staged.get(run_id)
        if marks is not None:
            self.view.partition_put(self.partition, fired_key(run_id), marks.encode())


class TickNode(Protocol):
    """What the tick keeps up to date for the HTTP API (`FaustNode`)."""

    last_turn: float  # when the loop last turned (GET /livez)
    indexed_recoveries: int  # the table recoveries the indexes were built after


class TimerTick:
    """The timers' tick: every due timer of the partitions this worker owns, fired."""

    def __init__(
        self,
        *,
        app: faust.App,
        partitions: int,
        runs: RunsTable,
        due_index: DueIndex,
        run_states: StateIndex,
        punctuator: Punctuator,
        deliver: Deliver,
        stats: OutcomeStats,
        metrics: WorkerMetrics,
        owned: Callable[[], list[int]],
        node: TickNode,
    ) -> None:
        self.app = app
        self.partitions = partitions
        self.runs = runs
        self.due_index = due_index
        self.run_states = run_states
        self.punctuator = punctuator
        self.deliver = deliver
        self.stats = stats
        self.metrics = metrics
        self.owned = owned
        self.node = node

    async def fire_timers(self) -> None:
        """Every due timer of the partitions this worker owns, fired once (`timers`)."""
        runs, due_index, run_states = self.runs, self.due_index, self.run_states
        self.node.last_turn = time.monotonic()  # the loop turns (GET /livez)
        if self.app.rebalancing or self.app.in_recovery:
            return
        if self.node.indexed_recoveries != runs.recoveries:  # partitions restored: re-read
            due_index.forget()
            run_states.forget()
            self.node.indexed_recoveries = runs.recoveries
        now_ms = int(time.time() * 1000)
        owned_now = self.owned()
        for partition in range(self.partitions):
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
                await self.fire_due(partition, now_ms, state, due)
            except Exception:
                # Those not marked fire at the next tick: the index is read again.
                log.exception("firing timers of partition %d failed; trying again", partition)
                due_index.forget(partition)

    async def fire_due(
        self, partition: int, now_ms: int, state: TableTimers, due: list[str]
    ) -> None:
        for firing in self.punctuator.fire(now_ms, state, due):
            # Each record acknowledged before the next: the proposal or alert, then the
            # mark; the mark reaches the table last.
            for record in firing.records:
                await self.deliver([sendable(record, partition)])
            state.persist(firing.snapshot.run_id)
            firing.log()
            self.stats.fired(firing)
            if not firing.is_deadline:
                self.metrics.alerts.labels(firing.snapshot.machine, firing.timer.name).inc()
