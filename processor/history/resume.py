"""What a restarted agent needs to carry on a run, and how a finished run is continued.

Pure, like the engine: a run's snapshot and history (and the machine catalog) in, a view
out; no I/O, no clock. The agent (or the SDK, or the CLI) reads the snapshot and history
from a worker and calls these.

- `resume_view`: the run as an agent rebuilding its context needs it: what is done (with
  results), what was left `executing` (outcome unknown: check the outside world with the
  step's idempotency key before doing it again), what failed, the checkpoint data, the
  deadlines pending, the events the machine allows next, the run it continues.
- `continuation_payload`: the `create` payload of a new run that carries on from a
  finished one: its succeeded steps, the steps it left executing (executing in the new
  run too), its checkpoint, and a link (run id, revision, hash of its latest
  transition). The engine decides one run at a time and cannot read the predecessor,
  so the creator reads it and carries the data.
- `continuation_problems`: whether a run's carried data is what its predecessor had, for
  anyone holding both snapshots (the engine records the link; this checks it).
"""

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field, JsonValue

from processor.engine.continuation import CARRIED
from processor.engine.lint import CHECKPOINT_EVENT, HEARTBEAT_EVENT, STEP_EVENTS
from processor.engine.machine import Machine, machine_for
from schemas.base import WireModel
from schemas.messages import CreatePayload, RunLink, RunSnapshot, StepStatus, Timer, Transition


class CompletedStep(WireModel):
    """A step that succeeded: never run it again; use its result."""

    result: JsonValue = None
    idempotency_key: str | None = None
    attempts: int
    revision: int = Field(description="The revision that recorded it (0: carried over).")


class UnfinishedStep(WireModel):
    """A step left `executing` (outcome unknown) or `failed` (its last attempt failed)."""

    idempotency_key: str | None = None
    attempts: int
    error: str | None = Field(default=None, description="The latest error, if any.")
    revision: int = Field(description="The revision that last changed it.")
    since_ms: int | None = Field(
        default=None, description="Broker time of that revision (None: not in the history)."
    )


class NextEvent(WireModel):
    """An event the run's machine takes in its current state."""

    event: str
    to_state: str | None = Field(description="Where it leads; None: the run stays put.")
    authorities: list[str]
    reasons: list[str] = Field(default_factory=list, description="Required: one of these.")


class ResumeView(WireModel):
    """A run as a restarted agent needs it to rebuild its context."""

    run_id: str
    machine: str
    machine_version: str | None
    state: str
    revision: int
    last_hash: str = Field(description="Send proposals with expected_revision = `revision`.")
    finished: bool = Field(description="The run is in a terminal state and never changes.")
    completed: dict[str, CompletedStep]
    executing: dict[str, UnfinishedStep] = Field(
        description="Outcome unknown: the agent may have crashed before or after the step "
        "did its work. Check with its idempotency key before running it again."
    )
    failed: dict[str, UnfinishedStep]
    checkpoint: dict[str, JsonValue]
    checkpoint_revision: int | None = Field(
        description="The revision that last wrote the checkpoint (0: carried over by a "
        "continuation; None: never written)."
    )
    pending: list[Timer] = Field(description="Deadlines and alerts armed for the run.")
    next_events: list[NextEvent]
    continues: RunLink | None = Field(description="The finished run this one carries on.")


def resume_view(
    snapshot: RunSnapshot, history: Sequence[Transition], machines: Mapping[str, Machine]
) -> ResumeView:
    """The run's resume view. `history` is the run's transitions (any order, any subset;
    only this run's are used, for the times steps and the checkpoint were written);
    `machines` the catalog, for the events the run's machine takes next."""
    at_ms = {t.revision: t.at_ms for t in history if t.run_id == snapshot.run_id}
    written = [
        t.revision
        for t in history
        if t.run_id == snapshot.run_id
        and t.event == CHECKPOINT_EVENT
        and t.revision <= snapshot.revision
    ]
    checkpoint_revision = max(written, default=None)
    if checkpoint_revision is None and snapshot.continues is not None and snapshot.checkpoint:
        checkpoint_revision = 0

    completed: dict[str, CompletedStep] = {}
    executing: dict[str, UnfinishedStep] = {}
    failed: dict[str, UnfinishedStep] = {}
    for name, step in snapshot.steps.items():
        if step.status is StepStatus.SUCCEEDED:
            completed[name] = CompletedStep(
                result=step.result,
                idempotency_key=step.idempotency_key,
                attempts=step.attempts,
                revision=step.revision,
            )
            continue
        unfinished = UnfinishedStep(
            idempotency_key=step.idempotency_key,
            attempts=step.attempts,
            error=step.error,
            revision=step.revision,
            since_ms=at_ms.get(step.revision),
        )
        (executing if step.status is StepStatus.EXECUTING else failed)[name] = unfinished

    machine = machine_for(machines, snapshot.machine, snapshot.machine_version)
    finished = machine is not None and snapshot.state in machine.terminal
    return ResumeView(
        run_id=snapshot.run_id,
        machine=snapshot.machine,
        machine_version=snapshot.machine_version,
        state=snapshot.state,
        revision=snapshot.revision,
        last_hash=snapshot.last_hash,
        finished=finished,
        completed=completed,
        executing=executing,
        failed=failed,
        checkpoint=dict(snapshot.checkpoint),
        checkpoint_revision=checkpoint_revision,
        pending=list(snapshot.timers),
        next_events=[] if machine is None or finished else _next_events(machine, snapshot.state),
        continues=snapshot.continues,
    )


def _next_events(machine: Machine, state: str) -> list[NextEvent]:
    events = [
        NextEvent(
            event=edge.event,
            to_state=edge.target,
            authorities=sorted(machine.rules[edge.event].authorities),
            reasons=sorted(edge.reasons),
        )
        for (source, _), edge in machine.edges.items()
        if source == state
    ]
    if state in machine.step_states:
        authorities = sorted(machine.step_authorities)
        for event in (*STEP_EVENTS, CHECKPOINT_EVENT, HEARTBEAT_EVENT):
            events.append(NextEvent(event=event, to_state=None, authorities=authorities))
    return events


def continuation_payload(
    predecessor: RunSnapshot,
    machines: Mapping[str, Machine],
    *,
    machine: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The `create` payload of a run continuing `predecessor` (by default on the same
    machine): its succeeded steps, the steps it left executing (still executing in the
    new run: their outcome is unknown until someone checks and settles them) and its
    checkpoint, linked to its latest transition.
    Only a finished run is continued: a live one would have two instances doing its
    steps. Raises ValueError otherwise."""
    held = machine_for(machines, predecessor.machine, predecessor.machine_version)
    if held is None:
        raise ValueError(f"machine '{predecessor.machine}' of run {predecessor.run_id} not held")
    if predecessor.state not in held.terminal:
        raise ValueError(
            f"run {predecessor.run_id} is '{predecessor.state}', not finished: only a "
            "finished run is continued (finish it first, e.g. with fatal_error)"
        )
    payload: dict[str, Any] = {
        "machine": machine or predecessor.machine,
        "continues": {
            "run_id": predecessor.run_id,
            "revision": predecessor.revision,
            "hash": predecessor.last_hash,
        },
        "steps": {
            name: _carried(step.status, step.idempotency_key, step.attempts, step.result)
            for name, step in predecessor.steps.items()
            if step.status in CARRIED
        },
        "checkpoint": dict(predecessor.checkpoint),
    }
    if options:
        payload["options"] = dict(options)
    return payload


def _carried(status: StepStatus, key: str | None, attempts: int, result: Any) -> dict[str, Any]:
    carried: dict[str, Any] = {"attempts": attempts}
    if status is StepStatus.EXECUTING:
        carried["status"] = status.value  # its outcome unknown: no result
    else:
        carried["result"] = result
    if key is not None:
        carried["idempotency_key"] = key
    return carried


def continuation_problems(created: Transition, predecessor: RunSnapshot) -> list[str]:
    """How what a run's `create` transition (`created`, revision 0) carried differs from
    what `predecessor` had at the revision it names; empty when it carried exactly the
    predecessor's succeeded and executing steps and checkpoint. A finished run's
    snapshot never changes, so its current snapshot is the one at that revision."""
    carried = CreatePayload.model_validate(created.payload)
    link = carried.continues
    if link is None:
        return [f"run {created.run_id} continues no run"]
    if link.run_id != predecessor.run_id:
        return [f"run {created.run_id} continues {link.run_id}, not {predecessor.run_id}"]
    problems = []
    if (link.revision, link.hash) != (predecessor.revision, predecessor.last_hash):
        problems.append(
            f"it names revision {link.revision} (hash {link.hash[:12]}); the predecessor is "
            f"at {predecessor.revision} (hash {predecessor.last_hash[:12]})"
        )
    held = {n: s for n, s in predecessor.steps.items() if s.status in CARRIED}
    for name, step in held.items():
        if name not in carried.steps:
            problems.append(f"step '{name}' was {step.status.value} there and was not carried")
        elif carried.steps[name].status != step.status.value:
            problems.append(
                f"step '{name}' was {step.status.value} there and was carried "
                f"{carried.steps[name].status}"
            )
        elif carried.steps[name].result != step.result:
            problems.append(f"step '{name}' was carried with another result")
    for name in carried.steps.keys() - held.keys():
        problems.append(f"step '{name}' was carried but neither succeeded nor executing there")
    if carried.checkpoint != predecessor.checkpoint:
        problems.append("the checkpoint was carried with other data")
    return problems
