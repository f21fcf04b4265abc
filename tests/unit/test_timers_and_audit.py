"""Timers the engine arms (deadlines, alerts), heartbeats, and the hash chain."""

from processor.engine.parse import lint_machine_text
from processor.engine.timers import retry_delay_ms
from schemas import RejectionCode
from schemas.audit import transition_hash
from tests.unit.driver import APPROVER, MODEL, Driver
from tests.unit.test_machines import GOOD


def _timers(run: Driver) -> dict[str, tuple[str, int, str | None]]:
    assert run.snapshot is not None
    return {t.name: (t.kind, t.due_at_ms, t.event) for t in run.snapshot.timers}


def test_approval_deadline_armed_on_entering_paused() -> None:
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    paused = run.commit("pause_for_approval")
    entered = paused.snapshot.entered_state_at_ms
    timers = _timers(run)
    assert timers["approval"] == ("deadline", entered + 1_800_000, "timeout")
    assert timers["task_paused_abandoned"] == ("alert", entered + 14_400_000, None)
    assert all(t.revision == paused.snapshot.revision for t in paused.snapshot.timers)
    run.commit("approval_granted", APPROVER, payload=run.decision())
    assert "approval" not in _timers(run)  # moving on disarms it


def test_run_options_override_deadlines() -> None:
    run = Driver(tick_ms=100)  # each proposal before the 200 ms heartbeat deadline
    run.create(
        "task_lifecycle", deadlines={"approval_timeout_ms": 500, "heartbeat_timeout_ms": 200}
    )
    started = run.commit("start")
    assert _timers(run)["heartbeat"] == (
        "deadline",
        started.snapshot.updated_at_ms + 200,
        "transient_error",
    )
    beat = run.beat()
    assert beat.snapshot.state == "running" and beat.snapshot.revision == started.snapshot.revision
    assert beat.snapshot.heartbeat_at_ms is not None
    assert _timers(run)["heartbeat"][1] == beat.snapshot.heartbeat_at_ms + 200  # pushed back
    assert beat.heartbeat.deadline_ms == beat.snapshot.heartbeat_at_ms + 200
    paused = run.commit("pause_for_approval")
    assert _timers(run)["approval"][1] == paused.snapshot.entered_state_at_ms + 500


def test_heartbeat_only_while_running_and_by_the_runtime() -> None:
    run = Driver()
    run.create("task_lifecycle")
    assert run.refuse("heartbeat").code is RejectionCode.INVALID_TRANSITION
    run.commit("start")
    assert run.refuse("heartbeat", MODEL).code is RejectionCode.UNAUTHORIZED
    run.beat()


def test_retry_backoff_grows_then_gives_up() -> None:
    run = Driver()
    run.create("task_lifecycle", max_retries=2)
    run.commit("start")
    dues = []
    for _ in range(2):
        failed = run.commit("transient_error")
        kind, due, event = _timers(run)["retry"]
        assert (kind, event) == ("deadline", "retry")
        dues.append(due - failed.snapshot.entered_state_at_ms)
        run.commit("retry")
    assert 800 <= dues[0] <= 1200 and 1600 <= dues[1] <= 2400  # 1 s, 2 s, +-20 %
    run.commit("transient_error")
    kind, due, event = _timers(run)["retry"]
    assert event == "max_retries_exceeded" and due == run.snapshot.entered_state_at_ms  # type: ignore[union-attr]


def test_retry_jitter_is_deterministic_and_bounded() -> None:
    a = retry_delay_ms(1000, 300_000, 0.2, 3, "run-1", 7)
    assert a == retry_delay_ms(1000, 300_000, 0.2, 3, "run-1", 7)
    assert 6400 <= a <= 9600
    spread = {retry_delay_ms(1000, 300_000, 0.2, 0, f"r{i}", 1) for i in range(50)}
    assert len(spread) > 10  # runs failing together do not retry together
    assert retry_delay_ms(1000, 5000, 0.0, 20, "r", 1) == 5000  # capped


def test_flapping_alert_after_three_retries() -> None:
    run = Driver()
    run.create("task_lifecycle", max_retries=5)
    run.commit("start")
    for _ in range(3):
        run.commit("transient_error")
        assert "task_retry_flapping" not in _timers(run)
        run.commit("retry")
    run.commit("transient_error")
    assert _timers(run)["task_retry_flapping"][1] == run.snapshot.entered_state_at_ms  # type: ignore[union-attr]


def test_terminal_runs_arm_nothing() -> None:
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("complete")
    assert run.snapshot is not None and run.snapshot.timers == []


def test_transitions_are_hash_chained() -> None:
    run = Driver()
    run.create("owned_run")
    run.commit("run_started")
    assert [t.prev_hash for t in run.history] == ["", run.history[0].hash]
    for t in run.history:
        assert t.hash == transition_hash(t.__dict__) and len(t.hash) == 64
    assert run.snapshot is not None and run.snapshot.last_hash == run.history[-1].hash
    forged = dict(run.history[1].__dict__, to_state="completed")
    assert transition_hash(forged) != run.history[1].hash


def test_deadline_lint() -> None:
    no_edge = (
        GOOD + "timeouts:\n  - {kind: approval, state: reviewing, event: submit, after_ms: 5}\n"
    )
    problems = lint_machine_text(no_edge, "m.yaml")
    assert any(
        p.startswith("m.yaml:16:") and "no transition (reviewing, submit)" in p for p in problems
    ), problems
    twice = GOOD + (
        "timeouts:\n"
        "  - {kind: approval, state: reviewing, event: drop, after_ms: 5}\n"
        "  - {kind: approval, state: reviewing, event: drop, after_ms: 6}\n"
        "  - {kind: heartbeat, state: nowhere, event: drop}\n"
        "alerts:\n  - {rule: slow, state: limbo, after_ms: 1}\n"
    )
    text = "\n".join(lint_machine_text(twice, "m.yaml"))
    assert "a second approval deadline on 'reviewing'" in text
    assert "timeouts.2.state: unknown state 'nowhere'" in text
    assert "alerts.0.state: unknown state 'limbo'" in text
    reason = (
        GOOD.replace(
            "{from: reviewing, event: drop, to: dropped}",
            "{from: reviewing, event: drop, to: dropped, reasons: [stale]}",
        )
        + "timeouts:\n  - {kind: approval, state: reviewing, event: drop, after_ms: 5}\n"
    )
    assert any("needs a reason from stale" in p for p in lint_machine_text(reason, "m.yaml"))
    # the worker's timers propose with a runtime key: a deadline event only approvers may
    # send would be refused, and leave the run waiting on it
    approvers_only = (
        GOOD.replace(
            "{from: reviewing, event: drop, to: dropped}",
            "{from: reviewing, event: approve2, to: dropped}",
        ).replace(
            "  drop: {authorities: [runtime, approver]}", "  approve2: {authorities: [approver]}"
        )
        + "timeouts:\n  - {kind: approval, state: reviewing, event: approve2, after_ms: 5}\n"
    )
    problems = lint_machine_text(approvers_only, "m.yaml")
    assert any(
        "which authority 'runtime' (the worker's timers) may not send" in p for p in problems
    )


def test_quiet_states_arm_nothing_for_runs_without_timeouts_of_their_own() -> None:
    """`decide` skips `arm_timers` in a machine's quiet states for runs that set no
    approval or heartbeat timeout: there it must return nothing, whatever the counts, the
    times and a retry backoff of the run's own; and every other state must be able to
    arm something (else the set is needlessly small)."""
    from processor.engine.parse import parse_machine
    from processor.engine.timers import arm_timers
    from processor.machines import builtin_machines, builtin_source
    from schemas.messages import Deadlines

    machines = [
        *builtin_machines().values(),
        parse_machine(
            builtin_source("task_lifecycle").replace(
                "name: task_lifecycle", "name: kept\nretention_ms: 5"
            )
        ),
        parse_machine(GOOD),
    ]
    for machine in machines:
        for state in machine.spec.states:
            armed = set()
            for retry_count in (0, 1, 5, 50):
                for own in (Deadlines(), Deadlines(retry_backoff_ms=7)):
                    timers = arm_timers(
                        machine,
                        run_id="r",
                        state=state,
                        revision=3,
                        entered_state_at_ms=1_000,
                        updated_at_ms=2_000,
                        heartbeat_at_ms=None,
                        retry_count=retry_count,
                        max_retries=3,
                        deadlines=own,
                    )
                    armed.update(t.name for t in timers)
            assert (state in machine.quiet_states) == (not armed), (machine.name, state, armed)


def test_an_approval_is_reminded_before_its_deadline_and_told_its_grace_after() -> None:
    """task_lifecycle: a reminder alert 15 minutes before the 30-minute approval deadline;
    the deadline fails the run (stop reason approval_timeout, the machine's); a decision
    within 5 minutes after is told to continue the run, one later is not."""
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    paused = run.commit("pause_for_approval").snapshot
    entered = paused.entered_state_at_ms
    timers = {t.name: t for t in paused.timers}
    assert timers["approval_reminder"].kind == "alert"
    assert timers["approval_reminder"].due_at_ms == entered + 900_000
    assert timers["approval"].due_at_ms == entered + 1_800_000
    decision = run.decision()
    run.now = timers["approval"].due_at_ms
    failed = run.commit("timeout", reason="approval_timeout", expected_revision=paused.revision)
    assert failed.snapshot.state == "failed" and failed.snapshot.stop_reason == "approval_timeout"
    late = run.refuse("approval_granted", APPROVER, payload=decision)
    assert late.code is RejectionCode.TERMINAL_STATE and "grace period" in late.detail
    run.now += 300_000
    later = run.refuse("approval_granted", APPROVER, payload=run.decision(pause=decision["pause"]))
    assert later.code is RejectionCode.TERMINAL_STATE and "grace" not in later.detail


def test_a_free_text_reason_is_no_stop_reason() -> None:
    run = Driver()
    run.create("run_state")
    run.commit("start")
    done = run.commit("fail", reason="the approver was rude")
    assert done.snapshot.stop_reason == "fail"
