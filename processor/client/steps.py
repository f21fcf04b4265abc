"""Steps: a side effect done at most once per run and step name, recorded in the run's
step ledger (docs/resume.md). A step is started (`step_started`, with the side effect's
idempotency key and the tool call's id), then settled: `step_succeeded` with its result,
or `step_failed` with the error. A step that succeeded before is not started again: the
worker refuses it `duplicate_step` with the stored result, and the step hands that back
without running the body.

    async with client.step(run_id, "refund", key=f"refund-{order}") as step:
        if not step.done:                    # done: it succeeded before; step.result has it
            step.result = await refund(order)
    receipt = step.result

or, the same in one call: `await client.run_step(run_id, "refund", refund_it, key=...)`.

The body raising an `Exception` records `step_failed` (the step may be started again);
a cancellation or an interrupt records nothing: the step stays executing, its outcome
unknown, and a resume checks the outside world before settling it (docs/resume.md). A
step still executing from an earlier attempt is refused `step_in_progress`: `Rejected`.
A stored result the refusal could not carry (too large for its topic) is read from the
run's snapshot (worker_urls=); NotServed when it cannot be: the body is not run again.
"""

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from schemas.codes import RejectionCode
from schemas.messages import Rejection, RunSnapshot, StepStatus, Transition

from .errors import NotServed, Rejected

if TYPE_CHECKING:  # (named in quotes below: ruff does not see those uses)
    from .aio import AsyncRunstateClient  # noqa: F401
    from .sync import RunstateClient  # noqa: F401

#: What a step's action returns: JSON (a stored result comes back as JSON reads it).
T = TypeVar("T")

#: How much of an error a `step_failed` carries (the ledger's limit).
MAX_ERROR_CHARS = 4096


#: The client a step proposes through (either).
ClientT = TypeVar("ClientT")


class _Step(Generic[ClientT]):
    """What a step knows, in either client: its names, and once started whether it had
    succeeded before (`done`) and its result."""

    def __init__(
        self,
        client: ClientT,
        run_id: str,
        name: str,
        key: str,
        call_id: str | None,
        timeout: float | None,
    ) -> None:
        self._client: ClientT = client
        self._timeout = timeout
        self.run_id = run_id
        self.name = name
        self.key = key
        self.call_id = call_id
        #: True when the step had succeeded before: `result` is the stored result and
        #: the body must not do the side effect again.
        self.done = False
        #: The step's result: what the body sets (recorded by `step_succeeded`: JSON),
        #: or the stored result when `done`.
        self.result: Any = None

    def _started_payload(self) -> dict[str, Any]:
        return {"step": self.name, "idempotency_key": self.key, "call_id": self.call_id}

    def _on_started(self, outcome: object) -> bool:
        """Take the answer to `step_started`; True when the stored result must be read
        from the run (a refusal too large for its topic leaves it out)."""
        if isinstance(outcome, Rejection):
            if outcome.code is not RejectionCode.DUPLICATE_STEP:
                raise Rejected(outcome)
            self.done, self.result = True, outcome.step_result
            return outcome.step_result is None  # None: stored as null, or left out
        if not isinstance(outcome, Transition):
            raise TypeError(f"step_started answered with {type(outcome).__name__}")
        return False

    def _stored(self, snapshot: RunSnapshot | None) -> None:
        """The stored result, from the run's snapshot: never a None taken for it."""
        record = None if snapshot is None else snapshot.steps.get(self.name)
        if record is None or record.status is not StepStatus.SUCCEEDED:
            raise NotServed(
                f"step '{self.name}' of run '{self.run_id}' succeeded before, and its "
                "stored result could not be read from the run (worker_urls=): not run again"
            )
        self.result = record.result

    def _settled(self, error: BaseException | None) -> tuple[str, dict[str, Any]] | None:
        """The proposal that settles the step as the body ended: None when there is
        nothing to record (it had succeeded before, or was cancelled or interrupted)."""
        if self.done or (error is not None and not isinstance(error, Exception)):
            return None
        if error is not None:
            said = f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS]
            return "step_failed", {"step": self.name, "error": said, "call_id": self.call_id}
        return "step_succeeded", {"step": self.name, "result": self.result, "call_id": self.call_id}


class AsyncStep(_Step["AsyncRunstateClient"]):
    """`async with client.step(...)`: see the module."""

    async def __aenter__(self) -> "AsyncStep":
        started = await self._client.propose_and_wait(
            self.run_id, "step_started", payload=self._started_payload(), timeout=self._timeout
        )
        if self._on_started(started):
            try:
                snapshot = await self._client.snapshot(self.run_id)
            except (ValueError, LookupError, ConnectionError) as exc:
                raise NotServed(f"{exc}: the stored result of step '{self.name}'") from exc
            self._stored(snapshot)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        settle = self._settled(exc)
        if settle is not None:
            event, payload = settle
            await self._client.propose_and_wait(
                self.run_id, event, payload=payload, timeout=self._timeout, raise_on_rejection=True
            )


class Step(_Step["RunstateClient"]):
    """`with client.step(...)`: the blocking client's twin of `AsyncStep`."""

    def __enter__(self) -> "Step":
        started = self._client.propose_and_wait(
            self.run_id, "step_started", payload=self._started_payload(), timeout=self._timeout
        )
        if self._on_started(started):
            try:
                snapshot = self._client.snapshot(self.run_id)
            except (ValueError, LookupError, ConnectionError) as exc:
                raise NotServed(f"{exc}: the stored result of step '{self.name}'") from exc
            self._stored(snapshot)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        settle = self._settled(exc)
        if settle is not None:
            event, payload = settle
            self._client.propose_and_wait(
                self.run_id, event, payload=payload, timeout=self._timeout, raise_on_rejection=True
            )


async def run_async_step(step: AsyncStep, action: Callable[[], Awaitable[T]]) -> T:
    """`action`'s result, awaited only when the step had not succeeded before (else
    the stored result)."""
    async with step:
        if not step.done:
            step.result = await action()
    result: T = step.result
    return result


def run_step(step: Step, action: Callable[[], T]) -> T:
    """`action`'s result, called only when the step had not succeeded before (else the
    stored result)."""
    with step:
        if not step.done:
            step.result = action()
    result: T = step.result
    return result
