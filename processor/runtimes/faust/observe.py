"""What the Faust runtime knows of its runs by state: the Prometheus metrics (GET
/metrics: the native worker's `WorkerMetrics`, fed by this runtime's own events) and the
runs in each state with the time each entered it (GET /runs?state=, /stats).

An outcome counts once its records are acknowledged by the broker (this runtime's
"commit"): `runstate_transaction_seconds` is then the time to deliver one batch's
outcomes and `runstate_transaction_records` its proposals. A proposal answered again
after a crash (at least once) is counted again by the worker that answers it. Runs by
state come from an in-memory index per partition (`StateIndex`), built by the same scan
of the partition's table that builds the timers' index and kept by every commit, so a
request never scans the table; restored records are counted as Faust applies the
changelog; no transaction is ever aborted. Each state's runs are kept in entry order, so
the runs longest in a state and the latest to enter any are read from the ends.
"""

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from sortedcontainers import SortedList

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


class StateRuns:
    """The runs in one (machine, state) of a partition: each run's entry time, and the
    runs in entry order, so the longest there and the latest to enter are read from the
    ends (no scan)."""

    __slots__ = ("entered", "order")

    def __init__(self, entered: dict[str, int] | None = None) -> None:
        self.entered: dict[str, int] = entered or {}
        # (entered_ms, run_id), sorted once when built from many
        self.order = SortedList((ms, run_id) for run_id, ms in self.entered.items())

    def add(self, run_id: str, entered_ms: int) -> None:
        if self.entered.get(run_id) == entered_ms:
            return  # already there (most commits leave a run where it was)
        self.remove(run_id)
        self.entered[run_id] = entered_ms
        self.order.add((entered_ms, run_id))

    def remove(self, run_id: str) -> None:
        entered = self.entered.pop(run_id, None)
        if entered is not None:
            self.order.remove((entered, run_id))

    def after(self, query: StateQuery) -> Iterator[tuple[int, str]]:
        """(entered_ms, run_id) past the query's cursor, in its order."""
        found: Iterator[tuple[int, str]]
        if query.newest:
            found = self.order.irange(maximum=query.after, inclusive=(True, False), reverse=True)
        else:
            found = self.order.irange(minimum=query.after, inclusive=(False, True))
        return found


class StateIndex(PartitionIndexes[dict[tuple[str, str], StateRuns]]):
    """Per partition: the runs in each (machine, state), each with its entry time."""

    def rebuild(self, partition: int, runs: Iterable[Entered]) -> None:
        grouped: dict[tuple[str, str], dict[str, int]] = {}
        for run in runs:
            grouped.setdefault((run.machine, run.state), {})[run.run_id] = run.entered_ms
        self._partitions[partition] = {key: StateRuns(e) for key, e in grouped.items()}

    def note(self, partition: int, previous: RunSnapshot | None, snapshot: RunSnapshot) -> None:
        """A commit: the run leaves the state it was in and is where `snapshot` says."""
        index = self._partitions.get(partition)
        if index is None:  # not indexed yet: the rebuild will see it
            return
        where = (snapshot.machine, snapshot.state)
        if (
            previous is not None
            and (previous.machine, previous.state) != where
            and (left := index.get((previous.machine, previous.state)))
        ):
            left.remove(previous.run_id)
        runs = index.get(where)
        if runs is None:  # (not `setdefault`: a StateRuns built per commit was 4% of a drain)
            runs = index[where] = StateRuns()
        runs.add(snapshot.run_id, snapshot.entered_state_at_ms)

    def drop(self, partition: int, previous: RunSnapshot) -> None:
        """A run forgotten: it is in no state any more."""
        index = self._partitions.get(partition)
        if index is not None and (left := index.get((previous.machine, previous.state))):
            left.remove(previous.run_id)

    def _states(self, owned: Iterable[int], key: tuple[str, str]) -> list[StateRuns]:
        return [found for p in owned if (found := self._partitions.get(p, {}).get(key))]

    def runs_by_state(
        self, machines: Mapping[str, Machine], owned: Iterable[int]
    ) -> Iterator[tuple[str, str, int]]:
        """(machine, state, runs) over `owned`; every state of every machine, zeros too."""
        owned = list(owned)
        for name, machine in sorted(machines.items()):
            for state in machine.spec.states:
                yield name, state, sum(len(s.entered) for s in self._states(owned, (name, state)))

    def in_state(
        self, machines: Mapping[str, Machine], owned: list[int], query: StateQuery
    ) -> list[Entered]:
        """Runs the query asks for over `owned`, in its order: each (partition, state)
        read from the right end on, merged, `limit` taken."""
        ordered = [
            _rows(states.after(query), key)
            for key in query.states(machines)
            for states in self._states(owned, key)
        ]
        merged = heapq.merge(*ordered, reverse=query.newest)
        return list(itertools.islice(merged, query.limit))

    def stats(self, machines: Mapping[str, Machine], owned: list[int]) -> list[StateStats]:
        """(machine, state, runs, oldest entered_state_at_ms), every state of every machine."""
        rows: list[StateStats] = []
        for name, machine in sorted(machines.items()):
            for state in machine.spec.states:
                found = self._states(owned, (name, state))
                oldest = [s.order[0][0] for s in found if s.order]
                runs = sum(len(s.entered) for s in found)
                rows.append((name, state, runs, min(oldest) if oldest else None))
        return rows


def _rows(found: Iterator[tuple[int, str]], key: tuple[str, str]) -> Iterator[Entered]:
    for entered, run_id in found:
        yield Entered(entered, run_id, *key)


def faust_metrics(
    machines: Mapping[str, Machine],
    index: StateIndex,
    owned: Callable[[], list[int]],
    lag: Callable[[], dict[int, int]],
) -> WorkerMetrics:
    return WorkerMetrics(machines, lambda: index.runs_by_state(machines, owned()), lag)
