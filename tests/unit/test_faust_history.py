"""The Faust runtime's history: a run's transitions read back from its topic partition."""

from processor.runtimes.faust.history import run_history
from tests.unit.driver import Driver


def test_each_revision_once_oldest_first_up_to_the_tables_snapshot() -> None:
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("transient_error")
    t0, t1, t2 = (t.model_dump_json().encode() for t in run.history)
    # a repeat after a crash (the same record again), in offset order
    values = [t0, t1, t1, t2]
    assert [t.revision for t in run_history(values, 2)] == [0, 1, 2]
    assert run_history(values, 2) == run.history
    # delivered, but the table's snapshot is not there yet: left out
    assert [t.revision for t in run_history(values, 1)] == [0, 1]
    assert run_history([], 0) == []


def test_a_run_id_forgotten_and_created_again_has_only_its_new_history() -> None:
    from processor.engine import Forget
    from processor.engine.parse import parse_machine
    from processor.machines import builtin_machines, builtin_source

    kept = parse_machine(
        builtin_source("run_state").replace("name: run_state", "name: run_state\nretention_ms: 5")
    )
    machines = {**builtin_machines(), "run_state": kept}
    old = Driver(machines=machines)
    old.create("run_state")
    old.commit("start")
    old.commit("complete")
    old.now += 10
    forget = old.propose("forget")
    assert isinstance(forget, Forget)
    new = Driver(machines=machines)
    new.now = old.now + 1
    new.create("run_state")
    values = [t.model_dump_json().encode() for t in [*old.history, forget.transition]]
    values += [t.model_dump_json().encode() for t in new.history]
    assert run_history(values, 0) == new.history
