"""Deadline proposals and the metadata that names them, against hostile senders.

A deadline becomes a proposal with a deterministic id (`timer:<run>:<revision>:<timer>`)
and `metadata.timer` naming it. Metadata is otherwise the sender's free-form JSON, and a
proposal id the sender's choice: neither may crash `decide` or pre-empt a deadline.
"""

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.engine import Beat, Commit, Forget
from processor.engine.timers import timer_proposal_id
from processor.history.replay import apply_transitions
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines
from processor.records.punctuator import Punctuator
from processor.trust.keyring import SigningKey
from schemas import Proposal, RejectionCode
from schemas.messages import Rejection
from tests.examples import examples
from tests.unit.driver import APPROVER, MODEL, RUNTIME, TOOL, Driver

MACHINES = builtin_machines()
PUNCTUATOR = Punctuator(TopicNames.with_prefix(), SigningKey.hmac("runtime", "s" * 16))
STEP = {"step": "s", "idempotency_key": "k"}


def _deadline(run: Driver, name: str) -> tuple[str, dict[str, Any]]:
    """The run's deadline `name` as the punctuator proposes it, when it falls due: its
    event and the rest of its fields (the clock moved to the due time)."""
    assert run.snapshot is not None
    timer = next(t for t in run.snapshot.timers if t.name == name)
    run.now = max(run.now, timer.due_at_ms + 1)
    sent = Proposal.model_validate_json(PUNCTUATOR.deadline(run.snapshot, timer, run.now).value)
    return sent.event, sent.model_dump(
        include={"proposal_id", "expected_revision", "reason", "metadata"}
    )


def _fire(run: Driver, name: str) -> Any:
    """The run's deadline `name` decided when it is due."""
    event, fields = _deadline(run, name)
    return run.propose(event, RUNTIME, **fields)


def test_a_deadline_id_sent_first_by_another_is_refused_and_the_deadline_still_fires() -> None:
    """A deadline's proposal id is predictable: a tool that sends a proposal under the
    id of a deadline still to be armed is refused, and the deadline fires when due (it
    is no `duplicate` of the tool's proposal, which would leave the run overdue for
    ever, every later proposal refused deadline_passed)."""
    run = Driver()
    run.create("task_lifecycle", deadlines={"heartbeat_timeout_ms": 60_000})
    run.commit("start")
    coming = timer_proposal_id(run.run_id, 2, "heartbeat")  # armed by the next commit
    named = {"timer": "heartbeat"}
    for principal, fields in [
        (TOOL, {}),
        (RUNTIME, {}),
        (RUNTIME, {"metadata": named}),
        (RUNTIME, {"metadata": named, "expected_revision": 1}),  # the id says 2
        (RUNTIME, {"metadata": {"timer": "approval"}, "expected_revision": 2}),
        (TOOL, {"metadata": named, "expected_revision": 2}),
    ]:
        refused = run.refuse("step_started", principal, proposal_id=coming, payload=STEP, **fields)
        assert refused.code is RejectionCode.UNAUTHORIZED, refused
        assert "timer:" in refused.detail and "choose another id" in refused.detail
    first = Driver(run_id="fresh")
    for fields in [{}, {"metadata": {"timer": "approval"}, "expected_revision": 0}]:
        created = first.refuse(
            "create",
            proposal_id=timer_proposal_id("fresh", 0, "approval"),
            payload={"machine": "task_lifecycle"},
            **fields,
        )
        assert created.code is RejectionCode.UNAUTHORIZED, created  # no deadline is a create
    started = run.commit("step_started", TOOL, payload=STEP)
    assert started.snapshot.revision == 2
    fired = _fire(run, "heartbeat")
    assert isinstance(fired, Commit) and fired.transition.proposal_id == coming
    assert run.state == "retrying"
    replayed = apply_transitions(MACHINES, [(t, i) for i, t in enumerate(run.history)])
    assert replayed.problems == [] and replayed.snapshots[run.run_id] == run.snapshot


def test_the_deadline_itself_sent_twice_is_a_duplicate() -> None:
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("pause_for_approval")
    event, fields = _deadline(run, "approval")
    assert isinstance(run.propose(event, RUNTIME, **fields), Commit)
    again = run.propose(event, RUNTIME, **fields)  # a producer's retry, say
    assert isinstance(again, Rejection) and again.code is RejectionCode.DUPLICATE


# -- any metadata, any proposal id, any sender ------------------------------------------
_TIMER_NAMES = ["heartbeat", "approval", "retry", "retention", "", "x"]
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(_TIMER_NAMES),
    st.text(max_size=5),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=2), st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=4,
)
_EVENTS = sorted(
    {e for m in MACHINES.values() for e in m.events} | {"create", "forget", "migrate", "heartbeat"}
)
_PRINCIPALS = [RUNTIME, TOOL, MODEL, APPROVER]


@st.composite
def _hostile(draw: st.DrawFn, run_id: str, revision: int) -> dict[str, Any]:
    """One proposal's fields: a known event, any metadata (often naming a timer by any
    value), and an id that is often a deadline's, for this revision or another."""
    metadata: dict[str, Any] = draw(st.dictionaries(st.text(max_size=4), _json, max_size=2))
    if draw(st.booleans()):
        metadata["timer"] = draw(_json)
    if draw(st.booleans()):
        metadata["due_at_ms"] = draw(_json)
    expected = draw(st.one_of(st.none(), st.integers(0, revision + 1)))
    proposal_id = draw(
        st.one_of(
            st.text(min_size=1, max_size=6).filter(lambda s: s.strip("\x00") == s),
            st.builds(
                timer_proposal_id,
                st.just(run_id),
                st.integers(0, revision + 2),
                st.sampled_from(_TIMER_NAMES[:4]),
            ),
        )
    )
    event = draw(st.sampled_from(_EVENTS))
    payload: dict[str, Any] = STEP if event.startswith("step_") else {}
    if event == "create":
        payload = {"machine": draw(st.sampled_from(sorted(MACHINES)))}
    return {
        "event": event,
        "proposal_id": proposal_id,
        "metadata": metadata,
        "expected_revision": expected,
        "payload": payload,
    }


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), machine=st.sampled_from(sorted(MACHINES)))
def test_no_metadata_or_id_crashes_decide_or_takes_a_deadlines_id(
    data: st.DataObject, machine: str
) -> None:
    """Every proposal is decided (no exception: `{"timer": []}` once raised TypeError
    out of decide, and its proposal went to the DLQ with no outcome for its sender); a
    commit under a deadline's id is that deadline, from the runtime, at the revision the
    id names; and the history replays to the same run."""
    run = Driver(run_id="r")
    run.create(machine, deadlines={"heartbeat_timeout_ms": 5_000, "approval_timeout_ms": 5_000})
    for _ in range(data.draw(st.integers(1, 25), label="proposals")):
        assert run.snapshot is not None
        revision = run.snapshot.revision
        fields = data.draw(_hostile(run.run_id, revision))
        principal = data.draw(st.sampled_from(_PRINCIPALS))
        if data.draw(st.integers(0, 4)) == 0:
            run.now += 10_000  # past the deadlines
        try:
            if Proposal(run_id="r", **fields).proposal_id in run.committed:
                continue  # the driver's dedupe memory is the store's: keep it simple
        except ValueError:
            continue  # not a proposal at all (intake refuses it before decide)
        decision = run.propose(principal=principal, **fields)
        assert isinstance(decision, Commit | Beat | Forget | Rejection)
        if isinstance(decision, Commit) and decision.transition.proposal_id.startswith("timer:"):
            timer = fields["metadata"].get("timer")
            assert principal == RUNTIME and isinstance(timer, str)
            assert decision.transition.proposal_id == timer_proposal_id("r", revision, timer)
        if isinstance(decision, Forget):
            return
    replayed = apply_transitions(MACHINES, [(t, i) for i, t in enumerate(run.history)])
    assert replayed.problems == [] and replayed.snapshots["r"] == run.snapshot
