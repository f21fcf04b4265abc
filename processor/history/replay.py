"""Rebuild runs from their transitions: every transition is decided again from the
snapshot before it, and must come out identical (hash included).

This is what `runstate replay` (stores rebuilt when local state and changelog are
gone) and `runstate get --at` (a run as it stood then) run on; pure over its inputs.
Reading the topic and writing the stores is `processor.history.rebuild`'s job.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from processor.engine import Commit, Forget, Machine, alive_at, decide
from processor.engine.machine import machine_for, with_current
from processor.engine.scope import Scope
from schemas.messages import Heartbeat, Proposal, Rejection, RunSnapshot, Transition

#: The scope a transition is decided again with: its key was checked when it was
#: committed (and `verify` checks it against the proposal's signature), so none of the
#: key's limits is checked again, and a committed `migrate` stands, as does a committed
#: continuation (its original took it; `verify` checks that both runs name each other).
AS_COMMITTED = Scope("(as committed)", operator=True, processor=True)


@dataclass
class ReplayProblem:
    transition_id: str
    offset: int | None
    detail: str

    def __str__(self) -> str:
        where = f" (offset {self.offset})" if self.offset is not None else ""
        return f"{self.transition_id}{where}: {self.detail}"


@dataclass
class Replayed:
    snapshots: dict[str, RunSnapshot] = field(default_factory=dict)
    applied: int = 0
    skipped: int = 0
    problems: list[ReplayProblem] = field(default_factory=list)


def proposal_of(transition: Transition) -> Proposal:
    """The proposal a transition committed, as far as it decides the outcome."""
    return Proposal.trusted(
        {
            "schema_version": 1,
            "proposal_id": transition.proposal_id,
            "run_id": transition.run_id,
            "event": transition.event,
            # Whatever it was, it matched: the run was then one revision behind. Said, since
            # a deadline's proposal is known by it (its id names the revision).
            "expected_revision": transition.revision - 1 if transition.revision else None,
            "reason": transition.reason,
            "payload": transition.payload,
            "metadata": transition.metadata,
        }
    )


def apply_transitions(
    machines: Mapping[str, Machine],
    transitions: Iterable[tuple[Transition, int | None]],
    start: Mapping[str, RunSnapshot] | None = None,
) -> Replayed:
    """Apply (transition, offset) pairs in log order onto `start` snapshots.

    A transition at or below a run's current revision is skipped (already applied); one
    that does not follow directly, or that deciding again does not reproduce, is a
    problem and leaves the run as it was."""
    result = Replayed(snapshots=dict(start or {}))
    for transition, offset in transitions:
        current = result.snapshots.get(transition.run_id)
        expected = 0 if current is None else current.revision + 1
        if current is not None and transition.revision < expected:
            result.skipped += 1
            continue
        if transition.revision != expected:
            result.problems.append(
                ReplayProblem(
                    transition.transition_id,
                    offset,
                    f"revision {transition.revision} does not follow {expected - 1}",
                )
            )
            continue
        machine = machines.get(current.machine) if current is not None else None
        # Heartbeats are not transitions: a transition names the latest one it was
        # decided with, and the time checks need it.
        if (
            current is not None
            and machine is not None
            and current.heartbeat_at_ms != transition.heartbeat_at_ms
        ):
            current = alive_at(machine, current, transition.heartbeat_at_ms)
        # A creation is decided again by the version it got (a later deploy may have
        # made another version the one new runs get).
        deciding = (
            with_current(machines, transition.machine, transition.machine_version)
            if current is None
            else machines
        )
        decision = decide(
            deciding,
            current,
            proposal_of(transition),
            transition.principal,
            transition.at_ms,
            scope=AS_COMMITTED,
        )
        if isinstance(decision, Forget) and decision.transition == transition:
            del result.snapshots[transition.run_id]  # forgotten (machine retention)
            result.applied += 1
            continue
        if not isinstance(decision, Commit):
            why = (
                f"{decision.code.value}: {decision.detail}"
                if isinstance(decision, Rejection)
                else f"a {type(decision).__name__.lower()} where a transition was recorded"
            )
            result.problems.append(
                ReplayProblem(
                    transition.transition_id, offset, f"deciding it again refuses it: {why}"
                )
            )
            continue
        if decision.transition != transition:
            result.problems.append(
                ReplayProblem(
                    transition.transition_id,
                    offset,
                    "deciding it again gives a different transition "
                    f"(hash {decision.transition.hash[:12]}, record {transition.hash[:12]})",
                )
            )
            continue
        result.snapshots[transition.run_id] = decision.snapshot
        result.applied += 1
    return result


def apply_heartbeats(
    machines: Mapping[str, Machine],
    snapshots: dict[str, RunSnapshot],
    heartbeats: Iterable[Heartbeat],
) -> set[str]:
    """Bring the runs' liveness up to the heartbeats taken since their latest transition
    (the heartbeats topic's answers; heartbeats are not transitions), so that a rebuild
    does not let a live run's heartbeat deadline fall due early. Returns the runs moved."""
    moved: set[str] = set()
    for beat in heartbeats:
        snapshot = snapshots.get(beat.run_id)
        if snapshot is None or (beat.revision, beat.state) != (snapshot.revision, snapshot.state):
            continue  # a beat of an earlier revision: the transitions after it decide
        if beat.at_ms < snapshot.updated_at_ms or beat.at_ms <= (snapshot.heartbeat_at_ms or 0):
            continue
        machine = machine_for(machines, snapshot.machine, snapshot.machine_version)
        if machine is not None:
            snapshots[beat.run_id] = alive_at(
                machine,
                snapshot,
                beat.at_ms,
                heartbeat_id=beat.proposal_id,
                heartbeat_signed_at_ms=beat.signed_at_ms,
            )
            moved.add(beat.run_id)
    return moved
