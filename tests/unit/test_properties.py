"""Property tests: random proposal sequences against each built-in machine."""

from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.engine import Commit, Machine, decide
from processor.machines import BUILTIN_NAMES, builtin_machines
from schemas import Principal, Proposal, Rejection, RunSnapshot
from tests.examples import examples

MACHINES = builtin_machines()
PRINCIPALS = [
    Principal(source="runtime", authority="runtime"),
    Principal(source="tool:get_status", authority="tool_executor"),
    Principal(source="model:planner", authority="model"),
    Principal(source="approver:alice", authority="approver"),
]
STEPS = ["charge", "notify"]


def reachable(machine: Machine) -> set[str]:
    seen, queue = {machine.spec.initial}, deque([machine.spec.initial])
    while queue:
        state = queue.popleft()
        for (source, _), edge in machine.edges.items():
            if source == state and edge.target not in seen:
                seen.add(edge.target)
                queue.append(edge.target)
    return seen


@st.composite
def proposals(draw: st.DrawFn, machine: Machine) -> tuple[list[tuple[Proposal, Principal]], int]:
    reasons = sorted({r for t in machine.spec.transitions for r in t.reasons})
    events = [*machine.events, "step_started", "step_succeeded", "step_failed", "create", "bogus"]
    count = draw(st.integers(min_value=1, max_value=60))
    out = []
    for i in range(count):
        event = "create" if i == 0 and draw(st.booleans()) else draw(st.sampled_from(events))
        if event == "create":
            payload: dict[str, object] = {"machine": machine.name}
            if draw(st.booleans()):
                payload["options"] = {"max_retries": draw(st.integers(0, 3))}
        elif event.startswith("step_"):
            step = draw(st.sampled_from(STEPS))
            payload = {
                "step_started": {"step": step, "idempotency_key": f"k-{step}"},
                "step_succeeded": {"step": step, "result": i},
                "step_failed": {"step": step, "error": "e"},
            }[event]
        elif event in machine.events and machine.events[event].records_fact:
            payload = {"fact": draw(st.sampled_from(["build=green", "build=red"]))}
        else:
            payload = {}
        proposal = Proposal(
            proposal_id=draw(st.sampled_from([f"p{i}", f"p{i}", "repeat"])),
            run_id="r",
            event=event,
            reason=draw(st.sampled_from([None, *reasons])),
            expected_revision=draw(st.sampled_from([None, None, 0, 1, 2, 3])),
            payload=payload,
        )
        out.append((proposal, draw(st.sampled_from(PRINCIPALS))))
    return out, draw(st.integers(min_value=0, max_value=10**12))


@pytest.mark.parametrize("name", BUILTIN_NAMES)
@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_sequences_keep_the_invariants(name: str, data: st.DataObject) -> None:
    machine = MACHINES[name]
    sequence, start = data.draw(proposals(machine))
    allowed_states = reachable(machine)
    snapshot: RunSnapshot | None = None
    commits = 0
    for offset, (proposal, principal) in enumerate(sequence):
        now = start + offset
        decision = decide(MACHINES, snapshot, proposal, principal, now)
        # exactly one outcome, and the same one for the same inputs
        assert isinstance(decision, Commit) != isinstance(decision, Rejection)
        assert decide(MACHINES, snapshot, proposal, principal, now) == decision
        if isinstance(decision, Rejection):
            assert decision.proposal_id == proposal.proposal_id
            continue
        new = decision.snapshot
        if snapshot is None:
            assert new.state == machine.spec.initial
        else:
            assert snapshot.state not in machine.terminal, "a terminal state changed"
            if new.state != snapshot.state:
                assert machine.edges[(snapshot.state, proposal.event)].target == new.state
        assert new.state in allowed_states
        commits += 1
        assert new.revision == commits - 1
        assert decision.transition.revision == new.revision
        assert decision.transition.transition_id == f"r:{new.revision}"
        assert 0 <= new.retry_count <= new.max_retries or new.retry_count == 0
        snapshot = new
