"""Checkpoints, the resume view and continuation: the engine records a run's
checkpoint data and a continuation's carried steps; `processor.history.resume` builds what a
restarted agent reads."""

from typing import Any

import pytest

from processor.engine import Beat, Commit
from processor.history.audit import Record, verify_continuations
from processor.history.replay import apply_transitions
from processor.history.resume import continuation_payload, continuation_problems, resume_view
from processor.machines import builtin_machines
from schemas import RejectionCode, RunSnapshot, StepStatus
from tests.unit.driver import APPROVER, MODEL, PROCESSOR, RUNTIME, TOOL, WORKER, Driver


def _agent_run() -> Driver:
    """A task_lifecycle run whose agent did s1, wrote a checkpoint and died in s2."""
    run = Driver(run_id="task-1")
    run.create("task_lifecycle", deadlines={"heartbeat_timeout_ms": 60_000})
    run.commit("start")
    run.commit("step_started", TOOL, payload={"step": "s1", "idempotency_key": "k-s1"})
    run.commit("step_succeeded", TOOL, payload={"step": "s1", "result": {"rows": 42}})
    run.commit("checkpoint", TOOL, payload={"data": {"cursor": 42, "plan": ["s1", "s2"]}})
    run.commit("step_started", TOOL, payload={"step": "s2", "idempotency_key": "k-s2"})
    return run


def _snapshot(run: Driver) -> RunSnapshot:
    assert run.snapshot is not None
    return run.snapshot


def test_checkpoint_is_a_transition_that_replaces_the_data() -> None:
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    first = run.commit("checkpoint", payload={"data": {"a": 1, "b": [1, 2]}})
    assert first.transition.revision == 2 and first.transition.from_state == "running"
    assert first.transition.to_state == "running"
    assert first.transition.payload == {"data": {"a": 1, "b": [1, 2]}}
    assert first.transition.prev_hash == run.history[1].hash  # in the chain
    second = run.commit("checkpoint", TOOL, payload={"data": {"c": 3}})
    assert second.snapshot.checkpoint == {"c": 3}  # replaced whole, not merged
    assert second.snapshot.revision == 3


def test_checkpoint_is_refused_outside_step_states_and_to_other_authorities() -> None:
    run = Driver()
    run.create("task_lifecycle")
    planned = run.refuse("checkpoint", payload={"data": {"a": 1}})
    assert planned.code is RejectionCode.INVALID_TRANSITION and "only in running" in planned.detail
    run.commit("start")
    for who in (MODEL, APPROVER):
        assert run.refuse("checkpoint", who, payload={"data": {}}).code is (
            RejectionCode.UNAUTHORIZED
        )
    bad = run.refuse("checkpoint", payload={"cursor": 1})
    assert bad.code is RejectionCode.SCHEMA_INVALID
    run.commit("checkpoint", payload={"data": {"kept": True}})
    run.commit("fatal_error")
    finished = run.refuse("checkpoint", payload={"data": {}})
    assert finished.code is RejectionCode.TERMINAL_STATE
    assert _snapshot(run).checkpoint == {"kept": True}  # a finished run keeps its last


def test_a_heartbeat_leaves_the_checkpoint_alone() -> None:
    run = _agent_run()
    before = _snapshot(run)
    beat = run.propose("heartbeat", TOOL)
    assert isinstance(beat, Beat)
    assert beat.snapshot.checkpoint == before.checkpoint and beat.snapshot.revision == 5


def test_machines_may_not_define_their_own_checkpoint_event() -> None:
    from processor.engine.lint import lint
    from processor.machines import builtin_machines

    spec = builtin_machines()["run_state"].spec
    events = {**spec.events, "checkpoint": spec.events["start"]}
    issues = lint(spec.model_copy(update={"events": events}))
    assert any("'checkpoint' is a built-in event" in str(issue) for issue in issues)


def test_replay_reproduces_checkpoints_and_continuations() -> None:
    run = _agent_run()
    run.commit("fatal_error")
    successor = Driver(run_id="task-2")
    successor.commit("create", payload=continuation_payload(_snapshot(run), successor.machines))
    replayed = apply_transitions(
        run.machines, [(t, None) for t in [*run.history, *successor.history]]
    )
    assert replayed.problems == []
    assert replayed.snapshots["task-1"] == run.snapshot
    assert replayed.snapshots["task-2"] == successor.snapshot


def test_resume_view_of_an_agent_that_died_mid_step() -> None:
    run = _agent_run()
    view = resume_view(_snapshot(run), run.history, run.machines)
    assert (view.run_id, view.state, view.revision, view.finished) == (
        "task-1",
        "running",
        5,
        False,
    )
    assert view.last_hash == run.history[-1].hash
    assert set(view.completed) == {"s1"} and view.completed["s1"].result == {"rows": 42}
    assert view.completed["s1"].idempotency_key == "k-s1"
    assert set(view.executing) == {"s2"} and view.executing["s2"].idempotency_key == "k-s2"
    assert view.executing["s2"].since_ms == run.history[5].at_ms
    assert view.failed == {}
    assert view.checkpoint == {"cursor": 42, "plan": ["s1", "s2"]}
    assert view.checkpoint_revision == 4
    assert [t.name for t in view.pending if t.kind == "deadline"] == ["heartbeat"]
    nexts = {e.event: e for e in view.next_events}
    assert nexts["complete"].to_state == "done" and nexts["complete"].authorities == ["runtime"]
    assert nexts["fatal_error"].to_state == "failed"
    assert nexts["step_started"].to_state is None and nexts["checkpoint"].to_state is None
    assert "approval_granted" not in nexts  # only from paused
    assert view.continues is None
    # The view is a frozen wire-style model: an agent can dump it into its prompt.
    assert '"s2"' in view.model_dump_json()


def test_resume_view_shows_failed_steps_and_a_finished_run() -> None:
    run = _agent_run()
    run.commit("step_failed", TOOL, payload={"step": "s2", "error": "quota exceeded"})
    view = resume_view(_snapshot(run), run.history, run.machines)
    assert view.executing == {} and view.failed["s2"].error == "quota exceeded"
    run.commit("fatal_error")
    done = resume_view(_snapshot(run), run.history, run.machines)
    assert done.finished and done.next_events == [] and done.state == "failed"


def test_resume_view_without_history() -> None:
    """The history only adds times; the view still comes from the snapshot alone."""
    view = resume_view(_snapshot(_agent_run()), [], Driver().machines)
    assert view.executing["s2"].since_ms is None and view.checkpoint_revision is None
    assert view.completed["s1"].result == {"rows": 42}


def test_a_continuation_carries_succeeded_steps_and_the_checkpoint() -> None:
    run = _agent_run()
    run.commit("step_failed", TOOL, payload={"step": "s2", "error": "quota exceeded"})
    run.commit("step_started", TOOL, payload={"step": "s3", "idempotency_key": "k-s3"})
    run.commit("fatal_error")
    old = _snapshot(run)
    payload = continuation_payload(old, run.machines, options={"max_retries": 1})
    # s1 with its result, s3 still executing (its outcome unknown), not the failed s2
    assert set(payload["steps"]) == {"s1", "s3"}
    assert payload["steps"]["s3"] == {
        "status": "executing",
        "attempts": 1,
        "idempotency_key": "k-s3",
    }
    assert payload["continues"] == {"run_id": "task-1", "revision": 8, "hash": old.last_hash}

    successor = Driver(run_id="task-2")
    created = successor.commit("create", payload=payload)
    new = created.snapshot
    assert new.continues is not None and new.continues.run_id == "task-1"
    assert new.state == "planned" and new.max_retries == 1
    assert new.steps["s1"].status is StepStatus.SUCCEEDED
    assert new.steps["s1"].result == {"rows": 42} and new.steps["s1"].revision == 0
    assert new.steps["s3"].status is StepStatus.EXECUTING
    assert new.steps["s3"].idempotency_key == "k-s3" and new.steps["s3"].result is None
    assert new.checkpoint == old.checkpoint
    assert created.transition.payload["continues"]["hash"] == old.last_hash  # hashed
    assert continuation_problems(created.transition, old) == []

    # A carried step is done: starting it again is refused with its result.
    successor.commit("start")
    again = successor.refuse("step_started", TOOL, payload={"step": "s1", "idempotency_key": "x"})
    assert again.code is RejectionCode.DUPLICATE_STEP and again.step_result == {"rows": 42}
    # A carried executing step is not run again blind, nor anything beside it, until
    # whoever checked the outside world settles it.
    for step in ("s3", "s2"):
        blind = successor.refuse(
            "step_started", TOOL, payload={"step": step, "idempotency_key": "y"}
        )
        assert blind.code is RejectionCode.STEP_IN_PROGRESS, blind
    assert successor.refuse("complete").code is RejectionCode.GUARD_FAILED
    successor.commit("step_failed", TOOL, payload={"step": "s3", "error": "checked: never ran"})
    successor.commit("step_started", TOOL, payload={"step": "s2", "idempotency_key": "k-s2b"})

    view = resume_view(_snapshot(successor), successor.history, successor.machines)
    assert view.continues == new.continues and view.checkpoint_revision == 0
    assert view.completed["s1"].revision == 0 and set(view.executing) == {"s2"}


def test_continuation_problems_names_what_differs() -> None:
    run = _agent_run()
    run.commit("fatal_error")
    old = _snapshot(run)
    payload = continuation_payload(old, run.machines)
    payload["steps"]["s1"]["result"] = {"rows": 0}
    payload["steps"]["s9"] = {"result": None}
    payload["checkpoint"] = {}
    payload["continues"]["revision"] = 3
    # The original refuses it; a processor key's create, taken as committed, shows what
    # `continuation_problems` finds in such a log.
    refused = Driver(run_id="task-2").refuse("create", payload=payload)
    assert refused.code is RejectionCode.CONTINUATION_REFUSED and "revision 3" in refused.detail
    created = Driver(run_id="task-2").commit("create", WORKER, payload=payload, scope=PROCESSOR)
    problems = continuation_problems(created.transition, old)
    assert any("revision 3" in p for p in problems)
    assert "step 's1' was carried with another result" in problems
    assert "step 's9' was carried but neither succeeded nor executing there" in problems
    assert "the checkpoint was carried with other data" in problems
    plain = Driver(run_id="task-3").create("task_lifecycle")
    assert continuation_problems(plain.transition, old) == ["run task-3 continues no run"]


def test_only_a_finished_run_is_continued() -> None:
    run = _agent_run()
    with pytest.raises(ValueError, match="not finished"):
        continuation_payload(_snapshot(run), run.machines)


@pytest.mark.parametrize(
    ("payload", "detail"),
    [
        (
            {"machine": "task_lifecycle", "steps": {"s1": {"result": 1}}},
            "carried only with 'continues'",
        ),
        ({"machine": "task_lifecycle", "checkpoint": {"a": 1}}, "carried only with 'continues'"),
        (
            {"machine": "task_lifecycle", "continues": {"run_id": "r", "revision": 1, "hash": "x"}},
            "continues.hash",
        ),
        (
            {
                "machine": "task_lifecycle",
                "continues": {"run_id": "task-2", "revision": 1, "hash": "a" * 64},
            },
            "cannot continue itself",
        ),
        (
            {
                "machine": "task_lifecycle",
                "continues": {"run_id": "r", "revision": 1, "hash": "a" * 64},
                "steps": {"s1": {"status": "failed"}},
            },
            "status",
        ),
    ],
)
def test_a_malformed_continuation_is_refused(payload: dict[str, object], detail: str) -> None:
    refused = Driver(run_id="task-2").refuse("create", RUNTIME, payload=payload)
    assert refused.code is RejectionCode.SCHEMA_INVALID and detail in refused.detail


def test_a_continuation_needs_the_create_authority() -> None:
    run = _agent_run()
    run.commit("fatal_error")
    payload = continuation_payload(_snapshot(run), run.machines)
    refused = Driver(run_id="task-2").refuse("create", TOOL, payload=payload)
    assert refused.code is RejectionCode.UNAUTHORIZED
    assert isinstance(Driver(run_id="task-2").propose("create", payload=payload), Commit)


def _continued_log(carry_steps: dict[str, Any] | None, deny: bool) -> dict[int, list[Record]]:
    """The transitions of a finished task (a step done, or denied) and of its
    continuation, as `verify` reads them."""
    old = Driver(run_id="task-1")
    old.create("task_lifecycle")
    old.commit("start")
    if deny:
        old.commit("pause_for_approval")
        old.commit("approval_denied", APPROVER, payload=old.decision())
    else:
        old.commit("step_started", payload={"step": "refund", "idempotency_key": "k"})
        old.commit("step_succeeded", payload={"step": "refund", "result": 7})
        old.commit("complete")
    assert old.snapshot is not None
    payload = continuation_payload(old.snapshot, old.machines)
    if carry_steps is not None:
        payload["steps"] = carry_steps
    new = Driver(run_id="task-2")
    if carry_steps is None and not deny:
        new.commit("create", payload=payload)  # the original takes it, naming it
    else:  # refused by the original: forged, as a processor key could
        assert new.refuse("create", payload=payload).code is RejectionCode.CONTINUATION_REFUSED
        new.commit("create", WORKER, payload=payload, scope=PROCESSOR)
    records = [
        Record(0, n, t.run_id.encode(), t.model_dump_json().encode(), None, 0)
        for n, t in enumerate([*old.history, *new.history])
    ]
    return {0: records}


def test_verify_proves_what_a_continuation_carried() -> None:
    machines = builtin_machines()
    assert verify_continuations(_continued_log(None, deny=False), machines) == []
    forged = verify_continuations(_continued_log({"wire": {"result": 1}}, deny=False), machines)
    assert len(forged) == 1 and "'wire' was carried but neither succeeded" in forged[0].detail
    assert "'task-1' does not name it" in forged[0].detail
    denied = verify_continuations(_continued_log(None, deny=True), machines)
    assert len(denied) == 1 and "an approver ended run 'task-1'" in denied[0].detail
