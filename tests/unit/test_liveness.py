"""Heartbeats are liveness, not transitions; a run remembers its proposal ids for life."""

import pytest

from processor.engine import Beat, Commit, decide
from processor.engine.answers import Answer
from processor.history.audit import Record, verify_partition
from processor.history.replay import apply_heartbeats, apply_transitions
from processor.machines import builtin_machines
from processor.records.pipeline import RunsInMemory, decide_record
from processor.trust.keygen import generate_keyring
from processor.trust.keyring import signing_key_from
from schemas import Proposal
from schemas.codes import RejectionCode
from tests.unit.driver import MODEL, TOOL, Driver

pytestmark = pytest.mark.unit
BEAT_MS = 1_000  # the runs' heartbeat timeout below
MACHINES = builtin_machines()


def _running(tick_ms: int = 100) -> Driver:
    run = Driver(tick_ms=tick_ms)
    run.create("task_lifecycle", max_retries=3, deadlines={"heartbeat_timeout_ms": BEAT_MS})
    run.commit("start")
    return run


def test_a_heartbeat_leaves_revision_chain_and_dedupe_alone() -> None:
    run = _running()
    before = run.snapshot
    assert before is not None
    beat = run.beat()
    after = beat.snapshot
    assert (after.revision, after.last_hash, after.recent_proposals, after.state) == (
        before.revision,
        before.last_hash,
        before.recent_proposals,
        before.state,
    )
    assert after.heartbeat_at_ms == beat.heartbeat.at_ms
    assert beat.heartbeat.revision == before.revision
    assert beat.heartbeat.deadline_ms == beat.heartbeat.at_ms + BEAT_MS
    assert len(run.history) == 2  # create, start: no transition for the heartbeat


def test_a_hundred_heartbeats_then_a_resent_retry_is_its_original_transition() -> None:
    run = _running()
    run.commit("transient_error")
    retried = run.commit("retry", proposal_id="retry-1")
    assert retried.snapshot.retry_count == 1
    for _ in range(100):
        run.beat()
    again = run.refuse("retry", proposal_id="retry-1")
    assert again.code is RejectionCode.DUPLICATE
    assert again.original_transition_id == retried.transition.transition_id
    assert run.snapshot is not None and run.snapshot.retry_count == 1


def test_a_compare_and_set_proposal_commits_between_heartbeats() -> None:
    run = _running()
    for n in range(30):
        run.beat()
        assert run.snapshot is not None
        revision = run.snapshot.revision
        if n % 10 == 9:
            step = f"s{n}"
            run.commit(
                "step_started",
                payload={"step": step, "idempotency_key": step},
                expected_revision=revision,
            )
            run.commit("step_succeeded", payload={"step": step}, expected_revision=revision + 1)
    assert run.snapshot is not None and run.snapshot.revision == 1 + 3 * 2


def test_heartbeats_push_the_deadline_and_a_late_one_is_refused() -> None:
    run = _running(tick_ms=600)  # each proposal 600 ms after the last; deadline 1 s
    for _ in range(5):  # 3 s in all: alive only because each beat pushes the deadline
        run.beat()
    run.commit("step_started", payload={"step": "a", "idempotency_key": "a"})
    run.now += 2 * BEAT_MS  # silence past the deadline
    late = run.refuse("heartbeat")
    assert late.code is RejectionCode.DEADLINE_PASSED
    assert run.refuse("step_started", payload={"step": "b", "idempotency_key": "b"}).code is (
        RejectionCode.DEADLINE_PASSED
    )


def _deadline_of(run: Driver, name: str) -> tuple[int, int]:
    """(due time, revision) of the run's armed deadline `name`."""
    assert run.snapshot is not None
    timer = next(t for t in run.snapshot.timers if t.name == name)
    return timer.due_at_ms, timer.revision


def test_a_deadline_proposed_before_a_heartbeat_moved_it_is_stale() -> None:
    run = _running(tick_ms=10)
    due, revision = _deadline_of(run, "heartbeat")
    run.now = due - 5
    run.beat()  # just in time: the deadline moves
    run.now += 10  # the punctuator's proposal (fired at the old due time) lands now
    stale = run.refuse(
        "transient_error",
        reason="recovery_stale_running",
        expected_revision=revision,
        metadata={"timer": "heartbeat", "due_at_ms": due},
    )
    assert stale.code is RejectionCode.REVISION_CONFLICT and "moved" in stale.detail
    due, revision = _deadline_of(run, "heartbeat")
    run.now = due + 1
    fired = run.commit(
        "transient_error",
        reason="recovery_stale_running",
        expected_revision=revision,
        metadata={"timer": "heartbeat", "due_at_ms": due},
    )
    assert fired.snapshot.state == "retrying"


def test_heartbeats_are_for_step_authorities_in_step_states() -> None:
    run = Driver()
    run.create("task_lifecycle")
    assert run.refuse("heartbeat").code is RejectionCode.INVALID_TRANSITION
    run.commit("start")
    assert run.refuse("heartbeat", MODEL).code is RejectionCode.UNAUTHORIZED
    assert run.beat(TOOL).heartbeat.principal == TOOL  # the tool executor may beat too


def test_a_history_with_heartbeats_replays_and_verifies() -> None:
    """Transitions decided while heartbeats kept the run alive past its first deadline:
    `apply_transitions` (replay, get --at) reproduces them from the transitions alone,
    `verify` from the proposals (heartbeats included)."""
    keyring = generate_keyring()
    events = [
        (
            "create",
            {
                "machine": "task_lifecycle",
                "options": {"deadlines": {"heartbeat_timeout_ms": BEAT_MS}},
            },
        ),
        ("start", {}),
    ]
    events += [("heartbeat", {})] * 6
    events += [("step_started", {"step": "a", "idempotency_key": "a"})]
    events += [("heartbeat", {})] * 3
    events += [("step_succeeded", {"step": "a"}), ("complete", {})]
    runs = RunsInMemory()
    proposals, transitions = [], []
    for offset, (event, payload) in enumerate(events):
        raw = (
            Proposal(proposal_id=f"p{offset}", run_id="r", event=event, payload=payload)
            .model_dump_json(exclude_none=True)
            .encode()
        )
        at_ms = 1_700_000_000_000 + offset * 600
        headers = signing_key_from(keyring, "runtime").headers(
            "runstate.proposals", b"r", raw, at_ms
        )
        proposals.append(Record(0, offset, b"r", raw, headers, at_ms))
        outcome = decide_record(
            b"r",
            raw,
            headers,
            at_ms,
            topic="runstate.proposals",
            keyring=keyring,
            machines=MACHINES,
            lookup=runs.lookup,
            seen=runs.seen,
            placement=None,
        )
        assert isinstance(outcome, Commit | Beat), outcome
        runs.apply(outcome)
        if isinstance(outcome, Commit):
            transitions.append(outcome.transition)
    assert [t.event for t in transitions] == [
        "create",
        "start",
        "step_started",
        "step_succeeded",
        "complete",
    ]
    assert transitions[2].heartbeat_at_ms is not None  # decided alive thanks to a beat
    replayed = apply_transitions(MACHINES, [(t, None) for t in transitions])
    assert replayed.problems == [] and replayed.applied == 5
    records = [
        Record(0, i, b"r", t.model_dump_json().encode(), None, 0) for i, t in enumerate(transitions)
    ]
    assert (
        verify_partition(
            0, proposals, records, topic="runstate.proposals", machines=MACHINES, keyring=keyring
        )
        == []
    )


def test_a_rebuild_takes_the_liveness_from_the_heartbeats_answers() -> None:
    """Replaying transitions alone leaves out the heartbeats since the latest one; the
    heartbeats topic's answers bring the run's liveness (and its deadline) back."""
    run = _running(tick_ms=300)
    beats = [run.beat().heartbeat for _ in range(3)]
    run.commit("step_started", payload={"step": "a", "idempotency_key": "a"})
    beats += [run.beat().heartbeat for _ in range(4)]
    replayed = apply_transitions(MACHINES, [(t, None) for t in run.history])
    assert replayed.problems == []
    assert replayed.snapshots["run-7"] != run.snapshot  # the last four beats are missing
    moved = apply_heartbeats(MACHINES, replayed.snapshots, beats)
    assert moved == {"run-7"} and replayed.snapshots["run-7"] == run.snapshot
    # answers of an earlier revision change nothing
    assert apply_heartbeats(MACHINES, replayed.snapshots, beats[:3]) == set()


def test_the_store_answers_every_id_the_snapshot_does_not_hold() -> None:
    """The snapshot's window holds a run's latest commits only: the store (here the
    driver's answers) is asked for every other id, and knows the refusals as well as
    the commits for the run's life."""
    run = Driver()
    window = run.machines["owned_run"].dedupe_window
    run.create("owned_run")
    run.commit("run_started")
    refused = run.refuse("run_resumed", proposal_id="early")  # not waiting: refused
    asked: list[str] = []

    def seen(proposal_id: str) -> Answer | None:
        asked.append(proposal_id)
        return run.answers.get(proposal_id)

    for n in range(window + 3):
        snapshot = run.snapshot
        assert snapshot is not None
        proposal = Proposal(
            proposal_id=f"fact-{n}",
            run_id=run.run_id,
            event="tool_result",
            payload={"fact": f"f{n}=1"},
        )
        asked.clear()
        decision = decide(run.machines, snapshot, proposal, TOOL, run.now, seen)
        assert isinstance(decision, Commit), decision
        assert asked == [f"fact-{n}"]
        run.commit("tool_result", TOOL, payload={"fact": f"f{n}=1"}, proposal_id=f"fact-{n}")
    first = run.refuse("create", payload={"machine": "owned_run", "options": {}}, proposal_id="p1")
    assert first.code is RejectionCode.DUPLICATE  # the create's id: out of the window
    assert run.refuse("run_resumed", proposal_id="early") == refused
