"""A finished run is forgotten after its machine's retention: its last transition is
`forget`, and everything else about it goes (snapshot, history, dedupe memory)."""

from pathlib import Path

import pytest

from processor.engine import Commit, Forget
from processor.engine.parse import parse_machine
from processor.history.replay import apply_transitions
from processor.machines import builtin_machines, builtin_source
from processor.records.pipeline import RunsInMemory
from schemas.codes import RejectionCode
from tests.unit.driver import RUNTIME, TOOL, Driver

pytestmark = pytest.mark.unit
KEEP_MS = 60_000
RETAINED = parse_machine(
    builtin_source("task_lifecycle").replace(
        "name: task_lifecycle", f"name: task_lifecycle\nretention_ms: {KEEP_MS}"
    )
)
MACHINES = {**builtin_machines(), "task_lifecycle": RETAINED}


def _finished() -> Driver:
    run = Driver(machines=MACHINES, tick_ms=10)
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("complete")
    return run


def test_a_finished_run_arms_its_retention_and_is_forgotten_when_it_passes() -> None:
    run = _finished()
    assert run.snapshot is not None
    (timer,) = run.snapshot.timers
    assert (timer.name, timer.event, timer.due_at_ms) == (
        "retention",
        "forget",
        run.snapshot.entered_state_at_ms + KEEP_MS,
    )
    early = run.refuse("forget", expected_revision=2)
    assert early.code is RejectionCode.INVALID_TRANSITION and "kept until" in early.detail
    assert run.refuse("forget", TOOL).code is RejectionCode.UNAUTHORIZED
    run.now = timer.due_at_ms
    decision = run.propose("forget", RUNTIME, expected_revision=2, reason="retention")
    assert isinstance(decision, Forget)
    last = decision.transition
    assert (last.event, last.revision, last.from_state, last.to_state) == (
        "forget",
        3,
        "done",
        "done",
    )


def test_only_finished_runs_of_machines_with_a_retention_are_forgotten() -> None:
    running = Driver(machines=MACHINES)
    running.create("task_lifecycle")
    running.commit("start")
    assert "only a finished run" in running.refuse("forget").detail
    kept = Driver()  # the built-in task_lifecycle keeps runs for ever
    kept.create("task_lifecycle")
    kept.commit("start")
    kept.commit("complete")
    assert kept.snapshot is not None and kept.snapshot.timers == []
    kept.now += 10**12
    assert "for ever" in kept.refuse("forget").detail


def test_forgetting_drops_the_run_and_its_dedupe_memory_and_replays() -> None:
    run = _finished()
    assert run.snapshot is not None
    run.now = run.snapshot.entered_state_at_ms + KEEP_MS
    forget = run.propose("forget", RUNTIME)
    assert isinstance(forget, Forget)
    runs = RunsInMemory()
    for t in run.history:
        runs.snapshots[t.run_id] = run.snapshot  # (as a store holds it)
        runs.answers[(t.run_id, t.proposal_id)] = t
    runs.apply(forget)
    assert runs.lookup("run-7") is None and runs.answers == {}
    # the transitions replay to nothing left of the run; a later run of the same id
    # starts afresh at revision 0
    history = [*run.history, forget.transition]
    replayed = apply_transitions(MACHINES, [(t, None) for t in history])
    assert replayed.problems == [] and "run-7" not in replayed.snapshots
    again = Driver(machines=MACHINES, tick_ms=10)
    again.now = run.now + 1
    created = again.create("task_lifecycle")
    assert isinstance(created, Commit) and created.transition.revision == 0
    replayed = apply_transitions(MACHINES, [(t, None) for t in [*history, *again.history]])
    assert replayed.problems == [] and replayed.snapshots["run-7"] == again.snapshot


def test_a_run_forgotten_and_created_again_in_one_transaction_stays_indexed(
    tmp_path: Path,
) -> None:
    """A run forgotten and created again in one flush, whose committed by-state entry
    equals the new run's, keeps its entry: deleted (forgotten), it is written again."""
    from processor.engine import decide
    from processor.runtimes.native.store.partition import PartitionStore
    from schemas.messages import Proposal

    machines = builtin_machines()
    create = Proposal(
        proposal_id="c", run_id="r", event="create", payload={"machine": "task_lifecycle"}
    )
    first = decide(machines, None, create, RUNTIME, 100)
    assert isinstance(first, Commit)
    store = PartitionStore(tmp_path / "s")
    txn = store.begin()
    txn.stage(first)
    txn.flush({})
    txn = store.begin()
    txn.stage_forget("r")
    again = decide(machines, None, create.model_copy(update={"proposal_id": "c2"}), RUNTIME, 100)
    assert isinstance(again, Commit)
    txn.stage(again)
    txn.flush({})
    assert [s.run_id for s in store.in_state("task_lifecycle", "planned", None, 10)] == ["r"]
    store.close()
