"""The Faust runtime's runs by state, kept in entry order, against a plain model: after
any commits, forgets and rebuilds, every query (a state or any, a machine or any, longest
there first or latest to enter first, from any cursor) reads what sorting the model's
runs gives, and the stats count and date them the same."""

import dataclasses
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from processor.machines import builtin_machines
from processor.runtimes.faust.observe import Entered, StateIndex
from processor.serving.peers import StateQuery
from tests.examples import examples

MACHINES = builtin_machines()
PAIRS = [(name, state) for name, m in sorted(MACHINES.items()) for state in m.spec.states]
RUNS = [f"r{i}" for i in range(12)] + ["r:1", "r/ü"]

_op = st.one_of(
    st.tuples(
        st.just("commit"),
        st.integers(0, 1),  # partition
        st.sampled_from(RUNS),
        st.sampled_from(PAIRS),
        st.integers(0, 40),  # entered_ms: ties are likely
    ),
    st.tuples(st.just("drop"), st.integers(0, 1), st.sampled_from(RUNS)),
    st.tuples(st.just("rebuild"), st.integers(0, 1)),
)
_query = st.builds(
    StateQuery,
    machine=st.one_of(st.none(), st.sampled_from([*sorted(MACHINES), "nobody"])),
    state=st.one_of(st.none(), st.sampled_from(sorted({s for _, s in PAIRS}))),
    after=st.one_of(st.none(), st.tuples(st.integers(-1, 41), st.sampled_from(RUNS))),
    limit=st.integers(1, 30),
    newest=st.booleans(),
)


def _snapshot(run_id: str, where: tuple[str, str], entered: int) -> Any:
    machine, state = where
    return SimpleNamespace(run_id=run_id, machine=machine, state=state, entered_state_at_ms=entered)


@settings(max_examples=examples(300), deadline=None)
@given(
    ops=st.lists(_op, max_size=60), queries=st.lists(_query, min_size=1, max_size=8), data=st.data()
)
def test_every_query_reads_what_sorting_the_runs_gives(
    ops: list[tuple[Any, ...]], queries: list[StateQuery], data: st.DataObject
) -> None:
    index = StateIndex()
    model: dict[int, dict[str, Entered]] = {0: {}, 1: {}}
    for partition in (0, 1):
        index.rebuild(partition, [])
    for op in ops:
        kind, partition = op[0], op[1]
        runs = model[partition]
        if kind == "commit":
            _, _, run_id, where, entered = op
            previous = runs.get(run_id)
            before = (
                None
                if previous is None
                else _snapshot(run_id, (previous.machine, previous.state), 0)
            )
            index.note(partition, before, _snapshot(run_id, where, entered))
            runs[run_id] = Entered(entered, run_id, *where)
        elif kind == "drop":
            if (previous := runs.pop(op[2], None)) is not None:
                index.drop(partition, _snapshot(op[2], (previous.machine, previous.state), 0))
        else:
            index.rebuild(partition, list(runs.values()))
    everything = [run for runs in model.values() for run in runs.values()]
    for query in queries:
        if everything and data.draw(st.booleans()):  # a cursor at a row there is
            row = data.draw(st.sampled_from(everything))
            query = dataclasses.replace(query, after=(row.entered_ms, row.run_id))
        wanted = sorted(
            (
                run
                for run in everything
                if (run.machine, run.state) in query.states(MACHINES)
                and query.beyond(run.entered_ms, run.run_id)
            ),
            reverse=query.newest,
        )[: query.limit]
        assert index.in_state(MACHINES, [0, 1], query) == wanted, query
    stats = {(m, s): (n, oldest) for m, s, n, oldest in index.stats(MACHINES, [0, 1])}
    for pair in PAIRS:
        entered = [r.entered_ms for r in everything if (r.machine, r.state) == pair]
        assert stats[pair] == (len(entered), min(entered) if entered else None), pair
