"""What the Faust runtime knows of its runs by state: the Prometheus metrics (GET
/metrics: the native worker's `WorkerMetrics`, fed by this runtime's own events) and the
runs in each state with the time each entered it (GET /runs?state=, /stats).

An outcome counts once its records are acknowledged by the broker (this runtime's
"commit"): `runstate_transaction_seconds` is then the time to deliver one proposal's
outcome and `runstate_transaction_records` is 1 per proposal. A proposal answered again
after a crash (at least once) is counted again by the worker that answers it. Runs by
state come from an in-memory index per partition (`StateIndex`), built by the same scan
of the partition's table that builds the timers' index and kept by every commit, so a
request never scans the table; restored records are counted as Faust applies the
changelog; no transaction is ever aborted.
"""

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from processor.engine import Machine
from processor.observe.metrics import WorkerMetrics
from processor.serving.peers import StateQuery, StateStats
from schemas.messages import RunSnapshot


@dataclass(frozen=True, order=True)
class Entered:
    """A run in a state since `entered_ms` (ordered: the longest there first)."""

    entered_ms: int
    run_id: str
    machine: str
    state: str


P = TypeVar("P")


class PartitionIndexes(Generic[P]):
    """An in-memory index per partition, built when first needed after a recovery."""

    def __init__(self) -> None:
        self._partitions: dict[int, P] = {}

    def indexed(self, partition: int) -> bool:
        return partition in self._partitions

    def forget(self, partition: int | None = None) -> None:
        """Drop a partition's index (all of them with None): rebuilt when next needed."""
        if partition is None:
            self._partitions.clear()
        else:
            self._partitions.pop(partition, None)


class StateIndex(PartitionIndexes[dict[tuple[str, str], dict[str, int]]]):
    """Per partition: the runs in each (machine, state), each with its entry time."""

    def rebuild(self, partition: int, runs: Iterable[Entered]) -> None:
        index: dict[tuple[str, str], dict[str, int]] = {}
        for run in runs:
            index.setdefault((run.machine, run.state), {})[run.run_id] = run.entered_ms
        self._partitions[partition] = index

    def note(self, partition: int, previous: RunSnapshot | None, snapshot: RunSnapshot) -> None:
        """A commit: the run leaves the state it was in and is where `snapshot` says."""
        index = self._partitions.get(partition)
        if index is None:  # not indexed yet: the rebuild will see it
            return
        if previous is not None:
            index.get((previous.machine, previous.state), {}).pop(previous.run_id, None)
        where = (snapshot.machine, snapshot.state)
        index.setdefault(where, {})[snapshot.run_id] = snapshot.entered_state_at_ms

    def drop(self, partition: int, previous: RunSnapshot) -> None:
        """A run forgotten: it is in no state any more."""
        index = self._partitions.get(partition)
        if index is not None:
            index.get((previous.machine, previous.state), {}).pop(previous.run_id, None)

    def _runs(self, owned: Iterable[int], key: tuple[str, str]) -> Iterator[Entered]:
        for partition in owned:
            for run_id, entered in self._partitions.get(partition, {}).get(key, {}).items():
                yield Entered(entered, run_id, *key)

    def runs_by_state(
        self, machines: Mapping[str, Machine], owned: Iterable[int]
    ) -> Iterator[tuple[str, str, int]]:
        """(machine, state, runs) over `owned`; every state of every machine, zeros too."""
        partitions = [self._partitions.get(p, {}) for p in owned]
        for name, machine in sorted(machines.items()):
            for state in machine.spec.states:
                yield name, state, sum(len(p.get((name, state), ())) for p in partitions)

    def in_state(
        self, machines: Mapping[str, Machine], owned: list[int], query: StateQuery
    ) -> list[Entered]:
        """Runs the query asks for over `owned`, in its order."""
        found = (
            run
            for key in query.states(machines)
            for run in self._runs(owned, key)
            if query.beyond(run.entered_ms, run.run_id)
        )
        pick = heapq.nlargest if query.newest else heapq.nsmallest
        return pick(query.limit, found)

    def stats(self, machines: Mapping[str, Machine], owned: list[int]) -> list[StateStats]:
        """(machine, state, runs, oldest entered_state_at_ms), every state of every machine."""
        rows: list[StateStats] = []
        for name, machine in sorted(machines.items()):
            for state in machine.spec.states:
                entered = [run.entered_ms for run in self._runs(owned, (name, state))]
                rows.append((name, state, len(entered), min(entered) if entered else None))
        return rows


def faust_metrics(
    machines: Mapping[str, Machine],
    index: StateIndex,
    owned: Callable[[], list[int]],
    lag: Callable[[], dict[int, int]],
) -> WorkerMetrics:
    return WorkerMetrics(machines, lambda: index.runs_by_state(machines, owned()), lag)
