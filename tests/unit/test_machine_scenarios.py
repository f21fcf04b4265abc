"""Scenarios of the three built-in machines, replayed through `decide`."""

from schemas import Principal, RejectionCode, StepStatus
from tests.unit.driver import APPROVER, MODEL, RUNTIME, TOOL, Driver


def test_task_lifecycle_full_lifecycle() -> None:
    run = Driver()
    created = run.create("task_lifecycle")
    assert (created.snapshot.state, created.snapshot.revision) == ("planned", 0)
    assert created.transition.transition_id == "run-7:0"
    run.commit("start")
    run.commit("pause_for_approval", payload={}, reason=None)
    assert run.state == "paused"
    run.commit("approval_granted", APPROVER, payload=run.decision())
    run.commit("transient_error")
    assert run.state == "retrying"
    assert run.snapshot is not None and run.snapshot.retry_count == 0
    run.commit("retry")
    assert run.snapshot.retry_count == 1
    done = run.commit("complete")
    assert done.snapshot.state == "done"
    assert [(t.from_state, t.to_state, t.event) for t in run.history] == [
        (None, "planned", "create"),
        ("planned", "running", "start"),
        ("running", "paused", "pause_for_approval"),
        ("paused", "running", "approval_granted"),
        ("running", "retrying", "transient_error"),
        ("retrying", "running", "retry"),
        ("running", "done", "complete"),
    ]
    assert run.snapshot.revision == 6 == len(run.history) - 1


def test_task_lifecycle_start_after_done_is_refused() -> None:
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("complete")
    refused = run.refuse("start")
    assert refused.code is RejectionCode.TERMINAL_STATE
    assert refused.state == "done" and "terminal" in refused.detail
    assert run.state == "done"


def test_task_lifecycle_retry_budget_then_max_retries_exceeded() -> None:
    run = Driver()
    run.create("task_lifecycle", max_retries=3)
    run.commit("start")
    for expected in (1, 2, 3):
        run.commit("transient_error")
        run.refuse("max_retries_exceeded")  # budget not spent yet: must retry instead
        run.commit("retry")
        assert run.snapshot is not None and run.snapshot.retry_count == expected
    run.commit("transient_error")
    refused = run.refuse("retry")
    assert refused.code is RejectionCode.RETRIES_EXHAUSTED
    assert "max_retries_exceeded" in refused.detail
    failed = run.commit("max_retries_exceeded")
    assert failed.snapshot.state == "failed"
    assert failed.snapshot.stop_reason == "max_retries_exceeded"


def test_task_lifecycle_approval_denied_and_timeout_fail_the_run() -> None:
    for event in ("approval_denied", "timeout"):
        run = Driver()
        run.create("task_lifecycle")
        run.commit("start")
        run.commit("pause_for_approval")
        if event == "approval_denied":
            run.commit(event, APPROVER, payload=run.decision())
        else:
            # the deadline's, proposed once it is due: not before
            refused = run.refuse(event, RUNTIME, reason="approval_timeout")
            assert refused.code is RejectionCode.GUARD_FAILED, refused
            assert "approval deadline" in refused.detail, refused.detail
            run.now = next(t.due_at_ms for t in run.snapshot.timers if t.name == "approval")
            run.commit(event, RUNTIME, reason="approval_timeout")
        assert run.state == "failed"


def test_task_lifecycle_blocked_then_resolved() -> None:
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("block_on_dependency", TOOL)
    assert run.state == "blocked"
    run.refuse("complete")
    run.commit("dependency_resolved")
    run.commit("complete")
    assert run.state == "done"


def test_task_lifecycle_idempotent_step_demo() -> None:
    """An idempotent step: a second run of a succeeded step gets the stored result."""
    run = Driver(run_id="idempotent_demo")
    run.create("task_lifecycle")
    run.commit("start")
    key = "idempotent_demo:step_refund"
    run.commit("step_started", payload={"step": "step_refund", "idempotency_key": key})
    assert run.snapshot is not None
    assert run.snapshot.steps["step_refund"].status is StepStatus.EXECUTING
    run.commit("step_succeeded", payload={"step": "step_refund", "result": "result_1"})
    again = run.refuse("step_started", payload={"step": "step_refund", "idempotency_key": key})
    assert again.code is RejectionCode.DUPLICATE_STEP
    assert again.step_result == "result_1"
    assert run.snapshot.steps["step_refund"].attempts == 1


def test_step_left_executing_is_visible_after_restart() -> None:
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("step_started", payload={"step": "charge", "idempotency_key": "k-1"})
    # The agent crashes here. A restarted agent reads the snapshot:
    assert run.snapshot is not None
    step = run.snapshot.steps["charge"]
    assert step.status is StepStatus.EXECUTING and step.idempotency_key == "k-1"
    # ... checks the outside world with k-1, then records what it found.
    run.commit("step_failed", payload={"step": "charge", "error": "gateway said: unknown key"})
    run.commit("step_started", payload={"step": "charge", "idempotency_key": "k-1"})
    run.commit("step_succeeded", payload={"step": "charge", "result": {"charge_id": "ch_1"}})
    record = run.snapshot.steps["charge"]
    assert record.attempts == 2 and record.result == {"charge_id": "ch_1"}
    assert record.error == "gateway said: unknown key"  # the original error is kept


def test_owned_run_runtime_tool_runtime_completes_at_revision_3() -> None:
    run = Driver()
    created = run.create("owned_run")
    assert (created.snapshot.state, created.snapshot.revision) == ("queued", 0)
    run.commit("run_started", expected_revision=0)
    run.commit("tool_result", TOOL, payload={"fact": "build=green"}, expected_revision=1)
    done = run.commit("run_completed", expected_revision=2)
    assert (done.snapshot.state, done.snapshot.revision) == ("completed", 3)
    assert done.snapshot.facts == ["build=green"]
    assert done.snapshot.stop_reason == "goal_reached"
    # The model proposes completion with the right revision: authority, not revision, refuses.
    refused = run.refuse("run_completed", MODEL, expected_revision=3)
    assert refused.code is RejectionCode.UNAUTHORIZED
    assert "model" in refused.detail


def test_owned_run_completion_needs_success_criteria() -> None:
    run = Driver()
    run.create("owned_run")
    run.commit("run_started")
    run.commit("tool_result", TOOL, payload={"fact": "build=red"})
    refused = run.refuse("run_completed")
    assert refused.code is RejectionCode.GUARD_FAILED
    assert "build=green" in refused.detail


def test_a_run_adds_success_criteria_and_never_drops_its_machines() -> None:
    for criteria in ([], ["tests=pass"]):
        refused = Driver().refuse(
            "create", payload={"machine": "owned_run", "options": {"success_criteria": criteria}}
        )
        assert refused.code is RejectionCode.LIMIT_EXCEEDED, refused
        assert "build=green" in refused.detail, refused.detail
    run = Driver()
    run.create("owned_run", success_criteria=["tests=pass", "build=green"])
    run.commit("run_started")
    run.commit("tool_result", TOOL, payload={"fact": "build=green"})
    assert "tests=pass" in run.refuse("run_completed").detail
    run.commit("tool_result", TOOL, payload={"fact": "tests=pass"})
    run.commit("run_completed")


def test_owned_run_reasons_are_required_for_waiting_and_failed() -> None:
    run = Driver()
    run.create("owned_run")
    run.commit("run_started")
    assert run.refuse("run_waiting").code is RejectionCode.REASON_REQUIRED
    assert run.refuse("run_waiting", reason="because").code is RejectionCode.REASON_REQUIRED
    # Waiting is for a callback; an approval is asked with its own event (and state).
    assert (
        run.refuse("run_waiting", reason="pending_approval").code is RejectionCode.REASON_REQUIRED
    )
    run.commit("run_waiting", reason="external_callback")
    assert run.refuse("run_resumed", APPROVER).code is RejectionCode.UNAUTHORIZED
    run.commit("run_resumed")
    failed = run.commit("run_failed", reason="tool_error")
    assert failed.snapshot.stop_reason == "tool_error"


def test_owned_run_approvals_are_asked_by_the_runtime_and_decided_by_an_approver() -> None:
    run = Driver()
    run.create("owned_run")
    run.commit("run_started")
    run.commit("approval_requested")
    assert run.state == "awaiting_approval"
    # The runtime that asked can neither resume the run nor decide the approval.
    assert run.refuse("run_resumed").code is RejectionCode.INVALID_TRANSITION
    assert run.refuse("approval_granted", payload=run.decision()).code is RejectionCode.UNAUTHORIZED
    run.commit("approval_granted", APPROVER, payload=run.decision())
    assert run.state == "running"
    run.commit("approval_requested")
    denied = run.commit("approval_denied", APPROVER, payload=run.decision())
    assert denied.snapshot.state == "cancelled" and denied.snapshot.stop_reason == "denied"


def test_owned_run_tool_source_must_be_a_tool() -> None:
    run = Driver()
    run.create("owned_run")
    run.commit("run_started")
    impostor = Principal(source="model:planner", authority="tool_executor")
    refused = run.refuse("tool_result", impostor, payload={"fact": "build=green"})
    assert refused.code is RejectionCode.UNAUTHORIZED and "tool:*" in refused.detail


def test_owned_run_concurrent_proposals_same_revision() -> None:
    """Two events both carry revision 1: the first commits, the second is a conflict."""
    run = Driver()
    run.create("owned_run")
    run.commit("run_started")
    run.commit("tool_result", TOOL, payload={"fact": "build=green"}, expected_revision=1)
    second = run.refuse("tool_result", TOOL, payload={"fact": "lint=ok"}, expected_revision=1)
    assert second.code is RejectionCode.REVISION_CONFLICT
    assert second.revision == 2


def test_run_state_transitions() -> None:
    run = Driver()
    run.create("run_state")
    assert run.state == "pending"
    run.commit("start")
    run.commit("need_approval")
    assert run.state == "waiting_approval"
    run.refuse("complete")  # cannot skip the approval
    run.commit("approved", APPROVER, payload=run.decision())
    run.commit("complete")
    assert run.state == "completed"
    for event in ("start", "fail", "cancel"):
        assert run.refuse(event).code is RejectionCode.TERMINAL_STATE


def test_run_state_approval_rejected_cancels() -> None:
    run = Driver()
    run.create("run_state")
    run.commit("start")
    run.commit("need_approval")
    run.commit("rejected", APPROVER, payload=run.decision())
    assert run.state == "cancelled"


def test_run_state_every_exit_from_running() -> None:
    for event, final in (("fail", "failed"), ("timeout", "timeout"), ("cancel", "cancelled")):
        run = Driver()
        run.create("run_state")
        run.commit("start")
        run.commit(event)
        assert run.state == final
