"""The step ledger (execute a step at most once, by its idempotency key), enforced by the engine.

A step moves none → executing → succeeded | failed; a failed or still-executing step
may be started again (the agent checked the outside world first). A succeeded step
is never started again: the refusal carries its stored result instead.
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


def apply_step(snapshot: RunSnapshot, event: str, payload: Any) -> StepRecord | StepRefusal:
    """The step's next ledger entry, or why the event is refused."""
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
            )
        )
    if record is None or record.status is not StepStatus.EXECUTING:
        status = "never started" if record is None else record.status.value
        return (
            RejectionCode.INVALID_TRANSITION,
            f"step '{step}' is not executing ({status}); send 'step_started' first",
            None,
        )
    if isinstance(payload, StepSucceededPayload):
        return record.evolved(status=StepStatus.SUCCEEDED, result=payload.result, revision=revision)
    assert isinstance(payload, StepFailedPayload)
    return record.evolved(status=StepStatus.FAILED, error=payload.error, revision=revision)
