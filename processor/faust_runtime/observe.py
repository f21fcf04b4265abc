"""The Faust runtime's Prometheus metrics (GET /metrics): the native worker's
`WorkerMetrics`, fed by this runtime's own events.

An outcome counts once its records are acknowledged by the broker (this runtime's
"commit"): `runstate_checkpoint_seconds` is then the time to deliver one proposal's
outcome and `runstate_checkpoint_records` is 1 per proposal. A proposal answered again
after a crash (at least once) is counted again by the worker that answers it. Runs per
state come from in-memory counts per partition (`StateCounts`), built by the same scan
that builds the timers' index and kept by every commit; restored records are counted as
Faust applies the changelog; no transaction is ever aborted.
"""

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping

from processor.engine import Machine
from processor.metrics import WorkerMetrics
from schemas.messages import RunSnapshot


class StateCounts:
    """Runs per (machine, state), per partition."""

    def __init__(self) -> None:
        self._partitions: dict[int, Counter[tuple[str, str]]] = {}

    def rebuild(self, partition: int, counts: Counter[tuple[str, str]]) -> None:
        self._partitions[partition] = counts

    def forget(self, partition: int | None = None) -> None:
        if partition is None:
            self._partitions.clear()
        else:
            self._partitions.pop(partition, None)

    def note(self, partition: int, previous: RunSnapshot | None, snapshot: RunSnapshot) -> None:
        counts = self._partitions.get(partition)
        if counts is None:  # not counted yet: the rebuild will see it
            return
        if previous is not None:
            counts[(previous.machine, previous.state)] -= 1
        counts[(snapshot.machine, snapshot.state)] += 1

    def runs_by_state(
        self, machines: Mapping[str, Machine], owned: Iterable[int]
    ) -> Iterator[tuple[str, str, int]]:
        """(machine, state, runs) over `owned`; every state of every machine, zeros too."""
        total: Counter[tuple[str, str]] = Counter()
        for partition in owned:
            total.update(self._partitions.get(partition, Counter()))
        for name, machine in sorted(machines.items()):
            for state in machine.spec.states:
                yield name, state, max(0, total[(name, state)])


def faust_metrics(
    machines: Mapping[str, Machine],
    counts: StateCounts,
    owned: Callable[[], list[int]],
    lag: Callable[[], dict[int, int]],
) -> WorkerMetrics:
    return WorkerMetrics(machines, lambda: counts.runs_by_state(machines, owned()), lag)
