"""A run continues another only as the original agrees: the messages between the two
runs (the ask, the answer), delivered by the workers with their own key."""

import pytest

from processor.engine import Commit, Relay, decide
from processor.engine.continuation import CONTINUED_BY, GRANTED, relay_id
from processor.engine.scope import Scope
from processor.history.audit import Record, verify_continuations
from processor.history.replay import apply_transitions
from processor.history.resume import continuation_payload
from processor.kafka.topics import TopicNames
from processor.records.punctuator import Punctuator, timer_key
from processor.trust.keyring import Keyring
from schemas import Proposal, Rejection, RejectionCode
from tests.unit.driver import APPROVER, PROCESSOR, RUNTIME, TOOL, WORKER, Driver

pytestmark = pytest.mark.unit


def _finished(run_id: str = "task-1", deny: bool = False) -> Driver:
    run = Driver(run_id=run_id)
    run.create("task_lifecycle")
    run.commit("start")
    if deny:
        run.commit("pause_for_approval")
        run.commit("approval_denied", APPROVER, payload=run.decision())
        return run
    run.commit("step_started", TOOL, payload={"step": "refund", "idempotency_key": "k"})
    run.commit("step_succeeded", TOOL, payload={"step": "refund", "result": 7})
    run.commit("checkpoint", TOOL, payload={"data": {"cursor": 3}})
    run.commit("fatal_error")
    return run


def _payload(run: Driver) -> dict[str, object]:
    assert run.snapshot is not None
    return continuation_payload(run.snapshot, run.machines)


def test_both_runs_name_each_other_and_replay_as_they_were() -> None:
    old = _finished()
    new = Driver(run_id="task-2")
    created = new.commit("create", payload=_payload(old))
    assert created.transition.proposal_id == "p1" and created.transition.principal == RUNTIME
    assert created.snapshot.continues is not None
    assert created.snapshot.continues.run_id == "task-1"
    assert created.snapshot.steps["refund"].result == 7
    named = old.history[-1]
    assert named.event == CONTINUED_BY and named.payload["run_id"] == "task-2"
    assert "create" not in named.payload  # the new run's transition holds what it carries
    assert named.from_state == named.to_state == "failed" and named.principal == WORKER
    assert old.snapshot is not None and old.snapshot.continued_by == "task-2"
    before = old.history[-2]
    assert old.snapshot.stop_reason is not None or before.reason is None  # kept as it was
    replayed = apply_transitions(old.machines, [(t, None) for t in [*old.history, *new.history]])
    assert replayed.problems == []
    assert replayed.snapshots["task-1"] == old.snapshot
    assert replayed.snapshots["task-2"] == new.snapshot


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        ("a step it never finished", "steps carried are not the succeeded and executing steps"),
        ("a step left out", "steps carried are not the succeeded and executing steps"),
        ("another result", "steps carried are not the succeeded and executing steps"),
        ("another checkpoint", "checkpoint carried is not the checkpoint"),
        ("an older revision", "names revision"),
        ("another hash", "names revision"),
    ],
)
def test_a_claim_that_is_not_the_originals_is_refused(tamper: str, why: str) -> None:
    old = _finished()
    payload = _payload(old)
    steps, link = payload["steps"], payload["continues"]
    assert isinstance(steps, dict) and isinstance(link, dict)
    if tamper == "a step it never finished":
        steps["wire"] = {"result": "sent"}
    elif tamper == "a step left out":
        steps.clear()
    elif tamper == "another result":
        steps["refund"]["result"] = 8
    elif tamper == "another checkpoint":
        payload["checkpoint"] = {"cursor": 4}
    elif tamper == "an older revision":
        link["revision"] -= 1
    else:
        link["hash"] = "0" * 64
    refused = Driver(run_id="task-2").refuse("create", payload=payload)
    assert refused.code is RejectionCode.CONTINUATION_REFUSED and why in refused.detail
    assert old.snapshot is not None and old.snapshot.continued_by is None
    assert old.history[-1].event == "fatal_error"  # nothing recorded there


def test_a_run_is_continued_once() -> None:
    old = _finished()
    Driver(run_id="task-2").commit("create", payload=_payload(old))
    assert old.snapshot is not None
    again = continuation_payload(old.snapshot, old.machines)  # at its new revision
    refused = Driver(run_id="task-3").refuse("create", payload=again)
    assert refused.code is RejectionCode.CONTINUATION_REFUSED
    assert "continued by another run already" in refused.detail
    assert "task-2" not in refused.detail  # a run the asker's prefixes may not reach


def test_a_run_an_approver_ended_is_not_carried_on() -> None:
    old = _finished(deny=True)
    refused = Driver(run_id="task-2").refuse("create", payload=_payload(old))
    assert refused.code is RejectionCode.CONTINUATION_REFUSED
    assert "an approver ended run 'task-1'" in refused.detail


def test_a_run_that_is_not_there_is_not_continued() -> None:
    payload = {
        "machine": "task_lifecycle",
        "continues": {"run_id": "nowhere-1", "revision": 3, "hash": "a" * 64},
    }
    refused = Driver(run_id="task-2").refuse("create", payload=payload)
    assert refused.code is RejectionCode.UNKNOWN_RUN and "nothing to continue" in refused.detail


def test_a_key_continues_only_runs_of_its_machines_and_learns_nothing_else() -> None:
    old = _finished()
    key = Scope("k-owned", machines=frozenset({"task_lifecycle", "owned_run"}))
    taken = Driver(run_id="task-2").propose("create", payload=_payload(old), scope=key)
    assert isinstance(taken, Commit)
    other = _finished("task-5")
    narrow = Scope("k-owned", machines=frozenset({"owned_run"}))
    payload = {**_payload(other), "machine": "owned_run"}
    refused = Driver(run_id="task-6").refuse("create", payload=payload, scope=narrow)
    assert refused.code is RejectionCode.UNAUTHORIZED and "limited to machines" in refused.detail
    assert "task_lifecycle" not in refused.detail and "failed" not in refused.detail


@pytest.mark.parametrize("event", [CONTINUED_BY, GRANTED, "continuation_refused"])
def test_only_the_workers_send_messages_between_runs(event: str) -> None:
    """An agent's forged grant (or ask, or refusal) is refused, whatever it carries."""
    grant = Proposal(
        proposal_id="p-forged",
        run_id="task-2",
        event=event,
        payload={
            "create": {
                "proposal_id": "p9",
                "run_id": "task-2",
                "event": "create",
                "payload": {"machine": "task_lifecycle"},
            },
            "principal": {"source": "runtime", "authority": "runtime"},
        },
    )
    for principal in (RUNTIME, TOOL, APPROVER):
        refused = decide(Driver().machines, None, grant, principal, 1)
        assert isinstance(refused, Rejection) and refused.code is RejectionCode.UNAUTHORIZED
        assert "processor key" in refused.detail


def test_the_ids_of_messages_between_runs_are_not_borrowed() -> None:
    run = Driver(run_id="task-2")
    borrowed = relay_id(GRANTED, "task-2", "p1")
    refused = run.refuse("create", payload={"machine": "task_lifecycle"}, proposal_id=borrowed)
    assert refused.code is RejectionCode.UNAUTHORIZED and "between runs" in refused.detail


def test_a_create_resent_while_asked_is_asked_once_and_answered_once() -> None:
    """The ask is deterministic: the original answers a second copy `duplicate` and
    grants nothing more; the create, resent after, gets its first answer again."""
    old = _finished()
    new = Driver(run_id="task-2")
    payload = _payload(old)
    first = new._decide(
        Proposal(proposal_id="c1", run_id="task-2", event="create", payload=payload), RUNTIME, None
    )
    second = new._decide(
        Proposal(proposal_id="c1", run_id="task-2", event="create", payload=payload), RUNTIME, None
    )
    assert isinstance(first, Relay) and first == second
    granted = old._decide(first.proposal, WORKER, PROCESSOR)
    assert isinstance(granted, Commit) and len(granted.sends) == 1
    asked_again = old._decide(second.proposal, WORKER, PROCESSOR)
    assert isinstance(asked_again, Rejection) and asked_again.code is RejectionCode.DUPLICATE
    created = new._decide(granted.sends[0], WORKER, PROCESSOR)
    assert isinstance(created, Commit) and created.transition.proposal_id == "c1"
    resent = new.propose("create", payload=payload, proposal_id="c1")
    assert isinstance(resent, Rejection) and resent.code is RejectionCode.DUPLICATE


def _ask(new: Driver, proposal_id: str, payload: dict[str, object]) -> Relay:
    asked = new._decide(
        Proposal(proposal_id=proposal_id, run_id=new.run_id, event="create", payload=payload),
        RUNTIME,
        None,
    )
    assert isinstance(asked, Relay)
    return asked


def test_a_grant_the_new_run_refuses_after_all_is_undone_at_the_original() -> None:
    """A run of the new id was created while the original was asked: the create is
    refused `run_exists`, and the original, told so, names no continuation and may be
    continued again."""
    old = _finished()
    new = Driver(run_id="task-2")
    asked = _ask(new, "c1", _payload(old))
    new.create("task_lifecycle")  # someone else's run takes the id meanwhile
    granted = old._decide(asked.proposal, WORKER, PROCESSOR)
    assert isinstance(granted, Commit)
    refused = new._decide(granted.sends[0], WORKER, PROCESSOR)
    assert isinstance(refused, Relay) and refused.refusal is not None
    assert refused.refusal.code is RejectionCode.RUN_EXISTS
    assert refused.refusal.proposal_id == "c1"
    undone = old._decide(refused.proposal, WORKER, PROCESSOR)
    assert isinstance(undone, Commit) and undone.transition.event == "continuation_undone"
    assert old.snapshot is not None and old.snapshot.continued_by is None
    again = old._decide(refused.proposal, WORKER, PROCESSOR)  # delivered twice: taken once
    assert isinstance(again, Rejection) and again.code is RejectionCode.DUPLICATE
    taken = Driver(run_id="task-3").commit("create", payload=_payload(old))
    assert taken.snapshot.continues is not None and old.snapshot.continued_by == "task-3"
    replayed = apply_transitions(old.machines, [(t, None) for t in old.history])
    assert replayed.problems == [] and replayed.snapshots["task-1"] == old.snapshot


def test_one_create_id_continuing_two_runs_leaves_one_named() -> None:
    """The same proposal id asks two originals (with other content): both grant, the
    second grant meets `proposal_id_reused`, and its original is told to forget it."""
    first, second = _finished("task-1"), _finished("task-5")
    new = Driver(run_id="task-2")
    asks = [_ask(new, "c1", _payload(first)), _ask(new, "c1", _payload(second))]
    grants = [
        run._decide(a.proposal, WORKER, PROCESSOR)
        for run, a in zip([first, second], asks, strict=True)
    ]
    assert all(isinstance(g, Commit) for g in grants)
    created = new._decide(grants[0].sends[0], WORKER, PROCESSOR)  # type: ignore[union-attr]
    assert isinstance(created, Commit)
    reused = new._decide(grants[1].sends[0], WORKER, PROCESSOR)  # type: ignore[union-attr]
    assert isinstance(reused, Relay) and reused.refusal is not None
    assert reused.refusal.code is RejectionCode.PROPOSAL_ID_REUSED
    second._decide(reused.proposal, WORKER, PROCESSOR)
    assert first.snapshot is not None and first.snapshot.continued_by == "task-2"
    assert second.snapshot is not None and second.snapshot.continued_by is None


def test_an_undo_from_an_agent_or_for_another_run_changes_nothing() -> None:
    old = _finished()
    Driver(run_id="task-2").commit("create", payload=_payload(old))
    forged = {"run_id": "task-2", "proposal_id": "p1"}
    refused = old.refuse("continuation_undone", RUNTIME, payload=forged)
    assert refused.code is RejectionCode.UNAUTHORIZED
    other = Proposal(
        proposal_id=relay_id("continuation_undone", "task-9", "p1"),
        run_id="task-1",
        event="continuation_undone",
        payload={"run_id": "task-9", "proposal_id": "p1"},
    )
    wrong = old._decide(other, WORKER, PROCESSOR)
    assert isinstance(wrong, Rejection) and wrong.code is RejectionCode.INVALID_TRANSITION
    assert old.snapshot is not None and old.snapshot.continued_by == "task-2"


def test_a_key_of_any_machine_names_and_a_long_refusal_travel() -> None:
    """Keyring machines are free text, and a scope refusal naming many of them is
    clipped to travel back: the create gets its refusal, never a failure."""
    old = _finished()
    many = {"billing *", *(f"machine-{n:03d}-" + "x" * 120 for n in range(40))}
    key = Scope("k", machines=frozenset({"owned_run", *many}))
    payload = {**_payload(old), "machine": "owned_run"}
    refused = Driver(run_id="task-2").refuse("create", payload=payload, scope=key)
    assert refused.code is RejectionCode.UNAUTHORIZED and refused.detail.endswith("...")
    assert "task_lifecycle" not in refused.detail


def test_the_stop_reason_of_the_original_stays() -> None:
    run = Driver(run_id="task-1")
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("fatal_error", reason="tool_error")
    assert run.snapshot is not None
    stop, last = run.snapshot.stop_reason, run.snapshot.last_reason
    Driver(run_id="task-2").commit("create", payload=_payload(run))
    assert run.snapshot.continued_by == "task-2"
    assert (run.snapshot.stop_reason, run.snapshot.last_reason) == (stop, last)


def test_verify_reports_an_original_naming_a_run_that_does_not_continue_it() -> None:
    """The log a worker would have written had the undo been lost: verify says so; with
    the undo, nothing."""
    old = _finished()
    new = Driver(run_id="task-2")
    asked = _ask(new, "c1", _payload(old))
    new.create("task_lifecycle")
    granted = old._decide(asked.proposal, WORKER, PROCESSOR)
    assert isinstance(granted, Commit)
    refused = new._decide(granted.sends[0], WORKER, PROCESSOR)
    assert isinstance(refused, Relay)

    def log() -> dict[int, list[Record]]:
        chain = [*old.history, *new.history]
        records = [
            Record(0, n, t.run_id.encode(), t.model_dump_json().encode(), None, 0)
            for n, t in enumerate(chain)
        ]
        return {0: records}

    lost = verify_continuations(log(), old.machines)
    assert len(lost) == 1 and "names run 'task-2' as its continuation" in lost[0].detail
    old._decide(refused.proposal, WORKER, PROCESSOR)
    assert verify_continuations(log(), old.machines) == []


def test_the_workers_sign_with_a_processor_key_else_the_first_runtime_key() -> None:
    def ring(**extra: dict[str, object]) -> Keyring:
        keys: dict[str, dict[str, object]] = {
            "zz-rt": {"source": "runtime", "authority": "runtime"},
            "aa-rt": {"source": "runtime", "authority": "runtime"},
            "op": {"source": "op", "authority": "runtime", "operator": True},
            **extra,
        }
        return Keyring.model_validate(
            {"keys": {k: {**v, "secret": f"{k}-" + "s" * 32} for k, v in keys.items()}}
        )

    plain = ring()
    assert timer_key(plain, None, None).key_id == "aa-rt"
    assert not Punctuator(TopicNames.with_prefix(), timer_key(plain, None, None), plain).relays
    with_worker = ring(**{"w": {"source": "worker", "authority": "runtime", "processor": True}})
    signing = timer_key(with_worker, None, None)
    assert signing.key_id == "w"
    assert Punctuator(TopicNames.with_prefix(), signing, with_worker).relays
