"""Continuations: a new run carries on from a finished one, as the original agrees.

The engine decides one run at a time, so a `create` that `continues` another run is
decided in three messages, each by one run, carried between the runs by the workers
(`Relay`, signed with a processor key):

1. The new run checks the create as any other (scope over both runs, authority,
   ceilings, sizes), then asks the original: `continued_by`, with digests of what the
   create claims to carry.
2. The original takes the continuation when it is finished, was not ended by an
   approver, was continued by no run before, and the claim is its own: the revision
   and hash it names, its succeeded and executing steps and its checkpoint (by digest). It then
   commits `continued_by` (naming the new run; its state stays) and grants; else it
   refuses, saying why.
3. The new run decides its create on the answer: `continuation_granted` commits it as
   the asking proposal, by the asking principal; `continuation_refused` refuses it with
   the original's reason.
4. Should the new run refuse the create after a grant (a run of its id was created in
   the meantime, or the create no longer fits), it sends `continuation_undone`, and the
   original names it no more (and may be continued again).

Whoever asked gets one outcome, the create's, after the round trip. Both runs name each
other in their history: the create's `continues`, the original's `continued_by`.
"""

import hashlib
from collections.abc import Mapping
from typing import Any

from processor.engine.machine import Machine
from processor.engine.scope import Scope
from schemas.audit import json_digest
from schemas.codes import RejectionCode
from schemas.identifiers import MAX_PROPOSAL_ID_BYTES
from schemas.messages import (
    ContinuationAnswer,
    ContinuationAsk,
    ContinuationUndo,
    CreatePayload,
    Principal,
    Proposal,
    RunSnapshot,
    StepStatus,
)

CONTINUED_BY = "continued_by"
GRANTED = "continuation_granted"
REFUSED = "continuation_refused"
UNDONE = "continuation_undone"
#: Events only the workers send, between runs, with a processor key.
RELAY_EVENTS = frozenset((CONTINUED_BY, GRANTED, REFUSED, UNDONE))
#: A refusal's detail as it travels back (the message must stay within the proposals'
#: size limit, which the ask was held to with room for it).
DETAIL_MAX_CHARS = 1000
#: How the proposal ids of those messages begin; no other proposal may use one.
RELAY_ID_PREFIX = "relay:"


def relay_id(event: str, run_id: str, proposal_id: str) -> str:
    """The id of the relay `event` about the `create` `proposal_id` of run `run_id`:
    deterministic, so a create resent while its continuation is asked is asked once."""
    digest = hashlib.sha256(f"{run_id}\x00{proposal_id}".encode()).hexdigest()
    relayed = f"{RELAY_ID_PREFIX}{event}:{digest}"
    assert len(relayed) <= MAX_PROPOSAL_ID_BYTES
    return relayed


def _steps_digest(steps: Mapping[str, tuple[Any, ...]]) -> str:
    return json_digest([[name, *steps[name]] for name in sorted(steps)])


def _step_claim(status: str, key: str | None, attempts: int, result: Any) -> tuple[Any, ...]:
    """What the digest holds of a carried step: a succeeded one as it always was, an
    executing one marked so (it could not pass for a succeeded one)."""
    if status == StepStatus.EXECUTING.value:
        return key, attempts, result, status
    return key, attempts, result


def claimed(create: CreatePayload) -> tuple[str, str]:
    """(steps digest, checkpoint digest) of what a continuing create carries."""
    steps = {
        n: _step_claim(s.status, s.idempotency_key, s.attempts, s.result)
        for n, s in create.steps.items()
    }
    return _steps_digest(steps), json_digest(create.checkpoint)


#: The steps a run hands on: what it completed, and what it left of unknown outcome (the
#: continuation must settle those before they run again).
CARRIED = (StepStatus.SUCCEEDED, StepStatus.EXECUTING)


def held(snapshot: RunSnapshot) -> tuple[str, str]:
    """(steps digest, checkpoint digest) of what a run holds to be carried on: its
    succeeded and executing steps, and its checkpoint."""
    steps = {
        n: _step_claim(s.status.value, s.idempotency_key, s.attempts, s.result)
        for n, s in snapshot.steps.items()
        if s.status in CARRIED
    }
    return _steps_digest(steps), json_digest(snapshot.checkpoint)


def asking_scope(key_id: str | None, machines: list[str] | None) -> Scope | None:
    """The machines' part of the asking key's scope, as a message names it (its run id
    prefixes were checked against both runs before it was sent)."""
    if machines is None:
        return None
    return Scope(key_id or "(the asking key)", frozenset(machines))


def ask(
    proposal: Proposal, principal: Principal, scope: Scope | None, create: CreatePayload
) -> Proposal:
    """The `continued_by` a continuing create (`proposal`) becomes, to the original."""
    assert create.continues is not None
    steps, checkpoint = claimed(create)
    payload = ContinuationAsk(
        run_id=proposal.run_id,
        proposal_id=proposal.proposal_id,
        principal=principal,
        key_id=None if scope is None else scope.key_id,
        machines=None if scope is None or scope.machines is None else sorted(scope.machines),
        revision=create.continues.revision,
        hash=create.continues.hash,
        steps_digest=steps,
        checkpoint_digest=checkpoint,
        create=proposal,
    )
    return Proposal(
        proposal_id=relay_id(CONTINUED_BY, proposal.run_id, proposal.proposal_id),
        run_id=create.continues.run_id,
        event=CONTINUED_BY,
        payload=payload.model_dump(mode="json", exclude_none=True),
    )


def answer(
    asked: ContinuationAsk,
    code: RejectionCode | None = None,
    detail: str | None = None,
) -> Proposal:
    """The original's answer to `asked`, to the new run: granted, or refused (`code`)."""
    assert asked.create is not None
    event = GRANTED if code is None else REFUSED
    if detail is not None and len(detail) > DETAIL_MAX_CHARS:
        detail = detail[: DETAIL_MAX_CHARS - 3] + "..."
    payload = ContinuationAnswer(
        create=asked.create,
        principal=asked.principal,
        key_id=asked.key_id,
        machines=asked.machines,
        code=code,
        detail=detail,
    )
    return Proposal(
        proposal_id=relay_id(event, asked.run_id, asked.proposal_id),
        run_id=asked.run_id,
        event=event,
        payload=payload.model_dump(mode="json", exclude_none=True),
    )


def undo(create: Proposal) -> Proposal:
    """The `continuation_undone` a granted `create` refused after all sends its original."""
    continues = create.payload.get("continues")
    assert isinstance(continues, dict)
    payload = ContinuationUndo(run_id=create.run_id, proposal_id=create.proposal_id)
    return Proposal(
        proposal_id=relay_id(UNDONE, create.run_id, create.proposal_id),
        run_id=str(continues["run_id"]),
        event=UNDONE,
        payload=payload.model_dump(mode="json"),
    )


def recorded(proposal: Proposal) -> Proposal:
    """The `continued_by` as the original's transition records it: without the create
    it carries (the new run's own transition has it)."""
    payload = {k: v for k, v in proposal.payload.items() if k != "create"}
    return proposal.model_copy(update={"payload": payload})


def ended_by_approver(machine: Machine, snapshot: RunSnapshot) -> bool:
    """Whether an approver ended the run (denied it, cancelled it): such a run is not
    carried on by another."""
    finished_by = snapshot.finished_by
    return finished_by is not None and finished_by.authority in machine.approval_authorities


def refusal(
    machine: Machine | None, snapshot: RunSnapshot, asked: ContinuationAsk
) -> tuple[RejectionCode, str] | None:
    """Why the run `snapshot` (of `machine`, None: a version not held) does not take the
    continuation `asked`, or None. The asking key's scope first, as for any proposal."""
    run_id = snapshot.run_id
    scope = asking_scope(asked.key_id, asked.machines)
    why = None if scope is None else scope.refuses_machine(snapshot.machine, run_id)
    if why is not None:
        return RejectionCode.UNAUTHORIZED, why
    if machine is None:
        why = f"run '{run_id}' uses a machine version this worker does not hold"
        return RejectionCode.UNKNOWN_MACHINE, why
    why = not_continuable(machine, snapshot)
    if why is not None:
        return RejectionCode.CONTINUATION_REFUSED, why
    if (asked.revision, asked.hash) != (snapshot.revision, snapshot.last_hash):
        why = (
            f"the create names revision {asked.revision} of run '{run_id}' (hash "
            f"{asked.hash[:12]}), which is at revision {snapshot.revision} (hash "
            f"{snapshot.last_hash[:12]}): read it again (runstate resume)"
        )
    else:
        steps, checkpoint = held(snapshot)
        if asked.steps_digest != steps:
            why = (
                f"the steps carried are not the succeeded and executing steps of run "
                f"'{run_id}' (runstate resume shows them)"
            )
        elif asked.checkpoint_digest != checkpoint:
            why = f"the checkpoint carried is not the checkpoint of run '{run_id}'"
    return None if why is None else (RejectionCode.CONTINUATION_REFUSED, why)


def not_continuable(machine: Machine, snapshot: RunSnapshot) -> str | None:
    """Why the run `snapshot` is carried on by no other run, whatever it carries."""
    run_id = snapshot.run_id
    why = None
    if snapshot.state not in machine.terminal:
        why = (
            f"run '{run_id}' has not finished: only a finished run is continued (a live "
            "one would have two instances doing its steps)"
        )
    elif snapshot.finished_by is None:
        # Who finished it is not known (a run finished before snapshots recorded it):
        # it might have been an approver.
        why = f"run '{run_id}' does not record who finished it; it cannot be carried on"
    elif ended_by_approver(machine, snapshot):
        why = f"an approver ended run '{run_id}'; it is not carried on by another run"
    elif snapshot.continued_by is not None:
        why = f"run '{run_id}' is continued by another run already; a run is continued once"
    return why
