"""The step ledger (execute a step at most once, by its idempotency key), enforced by the engine.

A step moves none → executing → succeeded | failed. A failed step may be started
again; a succeeded one never (the refusal carries its stored result instead); an
executing one not until it is settled: its outcome is unknown until the agent says what
it found (`step_failed` after a crash, once it checked the outside world), so starting
it again under any key could run the side effect twice. A step starts only while no
other is executing, unless the machine declares `concurrent_steps: true`. A machine
version written before `concurrent_steps` (the field absent) keeps the rule it was
written with: any step not succeeded may be started again, beside any other.
"""

from typing import Any

from pydantic import BaseModel

from schemas.codes import RejectionCode
from schemas.messages import (
    RunSnapshot,
    StepFailedPayload,
    StepRecord,
    StepStartedPayload,
    StepStatus,
    StepSucceededPayload,
)

STEP_PAYLOADS: dict[str, type[BaseModel]] = {
    "step_started": StepStartedPayload,
    "step_succeeded": StepSucceededPayload,
    "step_failed": StepFailedPayload,
}

#: (code, detail, stored result) when the ledger refuses an event.
StepRefusal = tuple[RejectionCode, str, Any]


def apply_step(
    snapshot: RunSnapshot, event: str, payload: Any, *, concurrent: bool | None = False
) -> StepRecord | StepRefusal:
    """The step's next ledger entry, or why the event is refused. `concurrent`: the
    machine's `concurrent_steps`; None (a version written before it) keeps that
    version's rule: any step may be started again, beside any other."""
    step: str = payload.step
    record = snapshot.steps.get(step)
    revision = snapshot.revision + 1
    if record is not None and record.status is StepStatus.SUCCEEDED:
        return (
            RejectionCode.DUPLICATE_STEP,
            f"step '{step}' already succeeded at revision {record.revision}; "
            "use its stored result instead of running it again",
            record.result,
        )
    if isinstance(payload, StepStartedPayload) and concurrent is not None:
        if record is not None and record.status is StepStatus.EXECUTING:
            return (
                RejectionCode.STEP_IN_PROGRESS,
                f"step '{step}' is executing (started at revision {record.revision}); "
                "settle it first: step_succeeded, or step_failed with what you found",
                None,
            )
        others = [
            name
            for name, other in snapshot.steps.items()
            if other.status is StepStatus.EXECUTING and name != step
        ]
        if others and not concurrent:
            return (
                RejectionCode.STEP_IN_PROGRESS,
                f"step {', '.join(sorted(others))} is executing and this machine runs one "
                "step at a time; settle it first",
                None,
            )
    if isinstance(payload, StepStartedPayload):
        return StepRecord.trusted(
            dict(
                status=StepStatus.EXECUTING,
                idempotency_key=payload.idempotency_key,
                attempts=(0 if record is None else record.attempts) + 1,
                result=None,
                # A previous failure stays visible until the step succeeds: errors are kept.
                error=None if record is None else record.error,
                revision=revision,
                call_id=payload.call_id,
            )
        )
    if record is None or record.status is not StepStatus.EXECUTING:
        status = "never started" if record is None else record.status.value
        return (
            RejectionCode.INVALID_TRANSITION,
            f"step '{step}' is not executing ({status}); send 'step_started' first",
            None,
        )
    call_id = payload.call_id or record.call_id
    if isinstance(payload, StepSucceededPayload):
        return record.evolved(
            status=StepStatus.SUCCEEDED, result=payload.result, revision=revision, call_id=call_id
        )
    assert isinstance(payload, StepFailedPayload)
    return record.evolved(
        status=StepStatus.FAILED, error=payload.error, revision=revision, call_id=call_id
    )
