"""Realistic lives of runs, one story per built-in machine, told as an agent would act.

A story is a generator: it yields the next proposal (a `Step`) and receives its outcome
(a Transition or a Rejection), so it can react like an agent does: retry after a
transient error until the budget is spent, fix the build before completing, stop when
an approval is denied. An approver's decision names the pause it answers (the revision
of the transition that entered the wait) and when it expires. Some steps are deliberate
mistakes (a model approving itself, the asker deciding its own approval, a decision for
a pause the run is no longer in, a step run twice, an event after the end) that the
processor must refuse.
"""

import random
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from schemas.codes import RejectionCode
from schemas.messages import Heartbeat, Rejection, Transition

Outcome = Transition | Heartbeat | Rejection


@dataclass(frozen=True)
class Step:
    event: str
    key: str = "runtime"  # which principal's key signs it
    payload: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None


Story = Generator[Step, Outcome, None]


def _refused(outcome: Outcome, code: RejectionCode | None = None) -> bool:
    return isinstance(outcome, Rejection) and (code is None or outcome.code is code)


def _step(name: str, run_id: str, result: Any) -> tuple[Step, Step]:
    started = Step("step_started", payload={"step": name, "idempotency_key": f"{run_id}:{name}"})
    return started, Step("step_succeeded", payload={"step": name, "result": result})


def _decision(asked: Outcome) -> dict[str, Any]:
    """The payload of a decision on the pause `asked` entered: 10 minutes to arrive."""
    pause = asked.revision if isinstance(asked, Transition) else 0
    return {"pause": pause, "expires_at_ms": int(time.time() * 1000) + 600_000}


def task_lifecycle(rng: random.Random, run_id: str) -> Story:
    """A refund agent: validate, approval, transient errors and retries, refund."""
    yield Step("create", payload={"machine": "task_lifecycle", "options": {"max_retries": 2}})
    yield Step("start")
    started, succeeded = _step("validate_order", run_id, {"order": run_id, "amount": 150})
    yield started
    yield succeeded
    if rng.random() < 0.25:  # a restarted agent tries the step again: refused, result kept
        yield started
    decision = _decision((yield Step("pause_for_approval")))
    if rng.random() < 0.15:  # the model cannot approve itself
        yield Step("approval_granted", key="model", payload=decision)
    if rng.random() < 0.1:  # a decision for another pause answers not this one
        stale = {**decision, "pause": decision["pause"] - 1}
        yield Step("approval_granted", key="approver", payload=stale)
    if rng.random() < 0.2:
        yield Step("approval_denied", key="approver", payload=decision)
        return
    if rng.random() < 0.05:  # an agent claims the approval deadline passed: refused, it
        yield Step("timeout", reason="approval_timeout")  # is the processor's once due
    yield Step("approval_granted", key="approver", payload=decision)
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        yield Step("transient_error", key="tool")
        if _refused((yield Step("retry")), RejectionCode.RETRIES_EXHAUSTED):
            yield Step("max_retries_exceeded")
            return
    if rng.random() < 0.1:
        yield Step("block_on_dependency", key="tool")
        yield Step("dependency_resolved", key="tool")
    started, succeeded = _step("refund", run_id, {"refund_id": f"rf-{run_id}"})
    yield started
    yield succeeded
    yield Step("complete")
    if rng.random() < 0.1:
        yield Step("start")  # after done: a terminal state never changes


def owned_run(rng: random.Random, run_id: str) -> Story:
    """The runtime starts, a tool reports facts, an approver decides what the runtime
    asks, only the runtime completes."""
    yield Step("create", payload={"machine": "owned_run"})
    yield Step("run_started")
    build = "build=red" if rng.random() < 0.3 else "build=green"
    yield Step("tool_result", key="tool", payload={"fact": build})
    if rng.random() < 0.3:
        yield Step("run_completed", key="model")  # the model holds no write authority
    if rng.random() < 0.2:
        if rng.random() < 0.2:
            yield Step("run_waiting")  # no reason: refused reason_required
        yield Step("run_waiting", reason="external_callback")
        yield Step("run_resumed")  # the callback arrived
    if rng.random() < 0.3:
        decision = _decision((yield Step("approval_requested")))
        if rng.random() < 0.2:  # the runtime asked: it cannot decide
            yield Step("approval_granted", payload=decision)
        if rng.random() < 0.2:
            yield Step("approval_denied", key="approver", payload=decision)  # -> cancelled
            return
        yield Step("approval_granted", key="approver", payload=decision)
    if rng.random() < 0.1:
        yield Step("run_failed", reason="tool_error")
        return
    if _refused((yield Step("run_completed")), RejectionCode.GUARD_FAILED):
        yield Step("tool_result", key="tool", payload={"fact": "build=green"})  # fix, rerun
        yield Step("run_completed")


def run_state(rng: random.Random, run_id: str) -> Story:
    """Start, an approval in the middle, then one of the four endings."""
    yield Step("create", payload={"machine": "run_state"})
    yield Step("start")
    if rng.random() < 0.6:
        decision = _decision((yield Step("need_approval")))
        if rng.random() < 0.1:
            yield Step("complete")  # cannot skip the approval
        if rng.random() < 0.25:
            yield Step("rejected", key="approver", payload=decision)  # -> cancelled
            return
        yield Step("approved", key="approver", payload=decision)
    ending = rng.choices(["complete", "fail", "timeout", "cancel"], weights=[70, 15, 10, 5])[0]
    yield Step(ending)


STORIES: dict[str, Callable[[random.Random, str], Story]] = {
    "task_lifecycle": task_lifecycle,
    "owned_run": owned_run,
    "run_state": run_state,
}
