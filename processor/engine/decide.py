"""`decide`: one proposal in, one outcome out. Pure: no I/O, no clock, deterministic.

Checks run in this order and the first failure wins (docs/wire.md §7 lists them with
the intake's before them): unauthorized (the key's run id prefixes), then the messages
between runs their own way (`_decide_relayed`), then

- `create`: schema_invalid (its payload), unknown_machine, unauthorized (the key's
  machines, the continued run's prefix), unauthorized (a `timer:` id), the answer
  already given (the first again, or proposal_id_reused) else run_exists when the run
  exists, unauthorized (create authorities), limit_exceeded (the machine's ceilings),
  checkpoint_too_large (a continuing create's checkpoint), then a continuing create
  asks its original (`Relay`);
- any other event: unknown_run, unauthorized (the key's machines), unknown_machine,
  unauthorized (a borrowed `timer:` id), the answer already given (duplicate, the
  remembered rejection, or proposal_id_reused); `migrate` and `forget` then go their
  own way (`_decide_migrate`, `_decide_forget`); else unknown_event, schema_invalid
  (the event's payload), unauthorized (the event's authorities), revision_conflict,
  terminal_state, deadline_passed; then a heartbeat: invalid_transition, duplicate (a
  replay); a checkpoint: invalid_transition, checkpoint_too_large; a step event:
  invalid_transition, duplicate_step, step_in_progress, invalid_transition (see
  `apply_step`); an edge: invalid_transition, reason_required, approval_wrong_pause,
  approval_expired, self_approval, guard_failed, retries_exhausted.

The pipeline refuses a commit whose records do not fit state_too_large. A refusal of an
existing run after the answer check is remembered as the run's answer to the proposal
id (`remembered`), but unknown_machine and duplicate (see processor/engine/answers.py).

A run is decided all its life by the machine version that created it
(`RunSnapshot.machine_version`); a version the catalog does not hold is refused
`unknown_machine`, never decided by another. `migrate` (payload {"version": ...}, by the
machine's migrate_authorities) moves a run to another version of its machine, refused
`incompatible_version` when the run's state, or the event of a deadline it has pending,
does not exist there.

The answer already given is checked as soon as the run is known rather than last: a
client that resends a proposal must get the original answer, not a fresh verdict
computed against a newer state (which would usually be `revision_conflict`). A run
remembers every proposal id it answered for its whole life: the snapshot keeps the
latest few commits, and `seen` (the caller's store) answers for the rest.

A finished run is forgotten by `forget`, which the worker's retention timer proposes
once the machine's `retention_ms` has passed since the run finished: the decision is a
`Forget` (its last transition, published; the runtime drops everything else about the
run).

A `checkpoint` (payload {"data": {...}}, by the step authorities, in step states only:
the data of the work in progress, recorded where steps are) replaces the run's checkpoint
as a whole and commits like any transition; data over CHECKPOINT_MAX_BYTES of canonical
JSON is refused `checkpoint_too_large`. A `create` that `continues` a finished run
starts with the steps and checkpoint its creator read from that run's snapshot, once
the original agreed (processor/engine/continuation.py: the create becomes a `Relay` to
the original, whose answer decides it): the steps are recorded as they were carried
(succeeded, or executing: of unknown outcome, settled before they run again), the
checkpoint is held to the same limit, and the link is kept in `RunSnapshot.continues`.

A heartbeat is liveness, not a transition: it passes the same checks up to
invalid_transition (it is recorded only in step states) and comes out as a `Beat`, the
run's snapshot with the heartbeat deadline pushed back and its revision, transition
chain and dedupe memory untouched. A deadline the processor proposed (its metadata names
the timer) is refused `revision_conflict` when a heartbeat has moved that deadline
since, as it is when a transition has.
"""

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from pydantic import ValidationError

from processor.engine import continuation
from processor.engine.answers import Answer, digest_of
from processor.engine.checkpoint import oversized
from processor.engine.lint import CREATE_EVENT, FORGET_EVENT, MIGRATE_EVENT, TIMER_AUTHORITY
from processor.engine.machine import Edge, Machine, machine_for
from processor.engine.scope import Scope
from processor.engine.steps import apply_step
from processor.engine.timers import (
    APPROVAL_REMINDER,
    EXPIRING,
    TIMER_ID_PREFIX,
    arm_timers,
    timer_proposal_id,
)
from schemas.audit import transition_hash
from schemas.base import describe_errors
from schemas.codes import RejectionCode as Code
from schemas.machine import GuardKind
from schemas.messages import (
    ApprovalPayload,
    ContinuationAnswer,
    ContinuationAsk,
    ContinuationUndo,
    CreatePayload,
    Deadlines,
    FactPayload,
    FactSource,
    Heartbeat,
    Pause,
    Principal,
    Proposal,
    Rejection,
    RunSnapshot,
    StepRecord,
    StepStatus,
    Timer,
    Transition,
)


class Commit(NamedTuple):
    """The proposal becomes fact: the run's next snapshot and the transition to publish."""

    snapshot: RunSnapshot
    transition: Transition
    #: (transition JSON, snapshot JSON) once encoded: the pipeline encodes them to
    #: measure them, and the runtimes publish those very bytes.
    encoded: tuple[bytes, bytes] | None = None
    #: Proposals the workers send to other runs with the commit (`Relay`).
    sends: tuple[Proposal, ...] = ()


class Beat(NamedTuple):
    """A heartbeat taken: the run's snapshot with its liveness updated (same revision) and
    the answer to publish."""

    snapshot: RunSnapshot
    heartbeat: Heartbeat


class Forget(NamedTuple):
    """A finished run past its machine's retention is forgotten: its last transition
    (`forget`, in the audit topic) is published and everything else about it (snapshot,
    history, dedupe memory, timers) is dropped."""

    transition: Transition


class Relay(NamedTuple):
    """Nothing changes here: the workers send `proposal` to another run, signed with
    their processor key (a continuation asked of its original, the original's answer, or
    a continuation undone; processor/engine/continuation.py). With `refusal`, that is
    the outcome of the proposal decided here, published as any refusal."""

    proposal: Proposal
    refusal: Rejection | None = None


Decision = Commit | Beat | Forget | Rejection | Relay


#: A run created without deadlines: one shared instance (the model is frozen).
_NO_DEADLINES = Deadlines()


def transition_id(run_id: str, revision: int) -> str:
    """'<run_id>:<revision>': unique per committed fact, so duplicates downstream show."""
    return f"{run_id}:{revision}"


def decide(
    machines: Mapping[str, Machine],
    snapshot: RunSnapshot | None,
    proposal: Proposal,
    principal: Principal,
    now_ms: int,
    seen: Callable[[str], Answer | None] | None = None,
    scope: Scope | None = None,
    signed_at_ms: int | None = None,
) -> Decision:
    """Decide `proposal` against the run's current `snapshot` (None: the run does not exist).

    `machines` is the catalog runs refer to by name; `principal` comes from a verified
    credential and `scope` limits which runs that credential reaches (None: all);
    `now_ms` is the proposal record's broker timestamp and `signed_at_ms` when its
    signature was made (None: not signed, as in tests); `seen` gives what the run
    answered a proposal id, beyond the commits the snapshot keeps (None: only those).
    """
    refused = None if scope is None else scope.refuses_run(proposal.run_id)
    if refused:  # before anything about the run, whether it exists included, is told
        return _reject(Code.UNAUTHORIZED, refused, proposal, principal, None, now_ms)
    if proposal.event in continuation.RELAY_EVENTS:
        return _decide_relayed(machines, snapshot, proposal, principal, now_ms, seen, scope)
    if proposal.event == CREATE_EVENT:
        return _decide_create(machines, snapshot, proposal, principal, now_ms, seen, scope)
    if snapshot is None:
        return _reject(
            Code.UNKNOWN_RUN,
            f"run '{proposal.run_id}' does not exist; send a 'create' proposal first",
            proposal,
            principal,
            None,
            now_ms,
        )
    refused = None if scope is None else scope.refuses_machine(snapshot.machine, proposal.run_id)
    if refused:
        return _reject(Code.UNAUTHORIZED, refused, proposal, principal, None, now_ms)
    machine = machines.get(snapshot.machine)
    if machine is None or machine.version != snapshot.machine_version:
        # Not the machine at hand (or none): the version the run is pinned to, if held.
        machine = machine_for(machines, snapshot.machine, snapshot.machine_version)
    if machine is None:
        held = machines.get(snapshot.machine)
        detail = (
            f"run uses machine '{snapshot.machine}', which this worker does not have loaded"
            if held is None
            else f"run is pinned to version {snapshot.machine_version} of machine "
            f"'{snapshot.machine}', which this worker does not hold (it has "
            f"{held.version}); publish that version (runstate machines publish) or deploy "
            "the worker that has it"
        )
        return _reject(Code.UNKNOWN_MACHINE, detail, proposal, principal, snapshot, now_ms)
    borrowed = _borrowed_id(proposal, principal)
    if borrowed:
        return _reject(Code.UNAUTHORIZED, borrowed, proposal, principal, snapshot, now_ms)
    answer = _answer(snapshot, proposal.proposal_id, seen)
    if answer is not None:
        digest = digest_of(proposal, principal)
        return _answered_again(proposal, principal, snapshot, answer, digest, now_ms)
    decision = _decide_event(
        machines, machine, snapshot, proposal, principal, now_ms, signed_at_ms, scope
    )
    # The digest only where it is kept: a commit's is its transition's, recomputed when
    # asked (answers.committed_digest).
    if isinstance(decision, Rejection) and decision.code not in _NOT_AN_ANSWER:
        return remembered(decision, digest_of(proposal, principal))
    return decision


#: Refusals of a known run that are not its answer to the proposal id: `unknown_machine`
#: says this worker cannot decide the run; `duplicate` refers to an answer given before.
_NOT_AN_ANSWER = frozenset((Code.UNKNOWN_MACHINE, Code.DUPLICATE))


def remembered(rejection: Rejection, digest: str) -> Rejection:
    """`rejection` as the run's answer to its proposal id for the run's life."""
    values = dict(rejection.__dict__)
    values["content_digest"] = digest
    return Rejection.trusted(values)


def _decide_event(
    machines: Mapping[str, Machine],
    machine: Machine,
    snapshot: RunSnapshot,
    proposal: Proposal,
    principal: Principal,
    now_ms: int,
    signed_at_ms: int | None,
    scope: Scope | None,
) -> Decision:
    """A proposal never answered before, to an existing run in the key's scope."""
    event = proposal.event
    if event == MIGRATE_EVENT:
        return _decide_migrate(machines, machine, snapshot, proposal, principal, now_ms, scope)
    if event == FORGET_EVENT:
        return _decide_forget(machine, snapshot, proposal, principal, now_ms)
    rule = machine.rules.get(event)
    if rule is None:
        return _reject(
            Code.UNKNOWN_EVENT,
            f"machine '{machine.name}' has no event '{event}'; "
            f"known: {', '.join(sorted(machine.events))}",
            proposal,
            principal,
            snapshot,
            now_ms,
        )

    payload: Any = None
    if rule.payload_model is not None:
        try:
            payload = rule.payload_model.__pydantic_validator__.validate_python(proposal.payload)
        except ValidationError as exc:
            return _reject(
                Code.SCHEMA_INVALID,
                f"payload of '{event}': {describe_errors(exc)}",
                proposal,
                principal,
                snapshot,
                now_ms,
            )

    if not rule.allows(principal.source, principal.authority):
        authorities, sources = rule.authorities, rule.sources
        return _reject(
            Code.UNAUTHORIZED,
            f"{principal.authority} ({principal.source}) may not send '{event}'; "
            f"allowed authorities: {', '.join(sorted(authorities))}"
            + (f"; sources: {', '.join(sources)}" if sources else ""),
            proposal,
            principal,
            snapshot,
            now_ms,
        )
    stale = _stale_or_finished(machine, snapshot, proposal, principal, now_ms)
    if stale is not None:
        return stale

    overdue = _overdue_deadline(machine, snapshot, now_ms)
    if overdue is not None and overdue.event != event:
        return _reject(
            Code.DEADLINE_PASSED,
            f"the run's {overdue.name} deadline fell due at {overdue.due_at_ms}, before this "
            f"proposal ({now_ms}): '{overdue.event}' is decided first; read the run again "
            "and propose against the state after it",
            proposal,
            principal,
            snapshot,
            now_ms,
        )

    if rule.is_heartbeat:  # a sign of life, not a transition
        if snapshot.state not in machine.step_states:
            return _reject(
                Code.INVALID_TRANSITION,
                f"heartbeats are recorded only in {', '.join(sorted(machine.step_states))}; "
                f"run is '{snapshot.state}'",
                proposal,
                principal,
                snapshot,
                now_ms,
            )
        replayed = _replayed_heartbeat(snapshot, proposal, signed_at_ms)
        if replayed is not None:
            return _reject(Code.DUPLICATE, replayed, proposal, principal, snapshot, now_ms)
        return _beat(machine, snapshot, proposal, principal, now_ms, signed_at_ms)

    if rule.is_checkpoint:
        if snapshot.state not in machine.step_states:
            return _reject(
                Code.INVALID_TRANSITION,
                f"checkpoints are recorded only in {', '.join(sorted(machine.step_states))}; "
                f"run is '{snapshot.state}'",
                proposal,
                principal,
                snapshot,
                now_ms,
            )
        too_large = oversized(payload.data)
        if too_large is not None:
            return _reject(
                Code.CHECKPOINT_TOO_LARGE, too_large, proposal, principal, snapshot, now_ms
            )
        return _commit(
            machine, snapshot, proposal, principal, now_ms, snapshot.state, checkpoint=payload.data
        )

    if rule.is_step:
        if snapshot.state not in machine.step_states:
            return _reject(
                Code.INVALID_TRANSITION,
                f"steps are recorded only in {', '.join(sorted(machine.step_states))}; "
                f"run is '{snapshot.state}'",
                proposal,
                principal,
                snapshot,
                now_ms,
            )
        outcome = apply_step(snapshot, event, payload, concurrent=machine.spec.concurrent_steps)
        if not isinstance(outcome, StepRecord):
            code, detail, result = outcome
            return _reject(code, detail, proposal, principal, snapshot, now_ms, step_result=result)
        steps = {**snapshot.steps, payload.step: outcome}
        return _commit(machine, snapshot, proposal, principal, now_ms, snapshot.state, steps=steps)

    edge = machine.edges.get((snapshot.state, event))
    if edge is None:
        return _reject(
            Code.INVALID_TRANSITION,
            f"no transition from '{snapshot.state}' on '{event}'",
            proposal,
            principal,
            snapshot,
            now_ms,
        )
    if edge.reasons and proposal.reason not in edge.reasons:
        given = "no reason" if proposal.reason is None else f"reason '{proposal.reason}'"
        return _reject(
            Code.REASON_REQUIRED,
            f"'{event}' from '{edge.source}' needs a reason, one of: "
            f"{', '.join(sorted(edge.reasons))}; got {given}",
            proposal,
            principal,
            snapshot,
            now_ms,
        )
    unripe = _unripe_deadline(machine, snapshot, edge, proposal, now_ms)
    if unripe is not None:
        return _reject(Code.GUARD_FAILED, unripe, proposal, principal, snapshot, now_ms)
    if isinstance(payload, ApprovalPayload):
        unbound = _unbound_approval(snapshot, payload, principal, now_ms)
        if unbound is not None:
            code, detail = unbound
            return _reject(code, detail, proposal, principal, snapshot, now_ms)
    failed_guard = _failed_guard(edge, snapshot) if edge.guards else None
    if failed_guard is not None:
        return _reject(Code.GUARD_FAILED, failed_guard, proposal, principal, snapshot, now_ms)

    retry_count = snapshot.retry_count
    retry = machine.retry
    if retry is not None and event == retry.event:
        retry_count += 1
        if retry_count > snapshot.max_retries:
            then = f"; send '{retry.exhausted_event}'" if retry.exhausted_event else ""
            return _reject(
                Code.RETRIES_EXHAUSTED,
                f"retry {retry_count} would exceed max_retries {snapshot.max_retries}{then}",
                proposal,
                principal,
                snapshot,
                now_ms,
            )

    facts = fact_sources = None
    if isinstance(payload, FactPayload) and payload.fact not in snapshot.facts:
        # A fact keeps the source that first recorded it.
        facts = [*snapshot.facts, payload.fact]
        source = FactSource.trusted(
            {"principal": principal, "revision": snapshot.revision + 1, "call_id": payload.call_id}
        )
        fact_sources = {**snapshot.fact_sources, payload.fact: source}
    stop_reason = None
    if edge.target in machine.terminal:
        # The machine names why a run stops: the edge's own stop reason, else one of the
        # reasons it lists or its deadline gives, else the event. A free-text reason is
        # no stop reason: any principal allowed the event could otherwise write the
        # run's epitaph.
        named = proposal.reason in edge.reasons or any(
            (t.state, t.event, t.reason) == (edge.source, event, proposal.reason)
            for t in machine.spec.timeouts
        )
        stop_reason = edge.stop_reason or (proposal.reason if named else None) or event
    return _commit(
        machine,
        snapshot,
        proposal,
        principal,
        now_ms,
        edge.target,
        retry_count=retry_count,
        facts=facts,
        fact_sources=fact_sources,
        stop_reason=stop_reason,
    )


def _decide_create(
    machines: Mapping[str, Machine],
    snapshot: RunSnapshot | None,
    proposal: Proposal,
    principal: Principal,
    now_ms: int,
    seen: Callable[[str], Answer | None] | None,
    scope: Scope | None,
    granted: bool = False,
) -> Decision:
    try:
        create = CreatePayload.model_validate(proposal.payload)
    except ValidationError as exc:
        return _reject(
            Code.SCHEMA_INVALID,
            f"payload of 'create': {describe_errors(exc)}",
            proposal,
            principal,
            None,
            now_ms,
        )
    if create.continues is not None and create.continues.run_id == proposal.run_id:
        return _reject(
            Code.SCHEMA_INVALID,
            "payload of 'create': a run cannot continue itself; continue a finished run "
            "as a new run id",
            proposal,
            principal,
            None,
            now_ms,
        )
    machine = machines.get(create.machine)
    if machine is None:
        return _reject(
            Code.UNKNOWN_MACHINE,
            f"no machine '{create.machine}'; loaded: {', '.join(sorted(machines))}",
            proposal,
            principal,
            None,
            now_ms,
        )
    # (Nothing of a run already there is told before its scope is checked.)
    if scope is not None:
        # Neither the machine asked for, nor that of a run already there, may be out of
        # scope; nor the run continued: a key continues only a run it could act on.
        out_of_scope = scope.refuses_machine(machine.name, proposal.run_id) or (
            None if snapshot is None else scope.refuses_machine(snapshot.machine, proposal.run_id)
        )
        if out_of_scope is None and create.continues is not None:
            out_of_scope = scope.refuses_run(create.continues.run_id)
        if out_of_scope:
            return _reject(Code.UNAUTHORIZED, out_of_scope, proposal, principal, None, now_ms)
    borrowed = _borrowed_id(proposal, principal)
    if borrowed:
        return _reject(Code.UNAUTHORIZED, borrowed, proposal, principal, snapshot, now_ms)
    if snapshot is not None:
        answer = _answer(snapshot, proposal.proposal_id, seen)
        if answer is not None:
            digest = digest_of(proposal, principal)
            return _answered_again(proposal, principal, snapshot, answer, digest, now_ms)
        return _reject(
            Code.RUN_EXISTS,
            f"run '{proposal.run_id}' already exists (machine '{snapshot.machine}', "
            f"revision {snapshot.revision})",
            proposal,
            principal,
            snapshot,
            now_ms,
        )
    if principal.authority not in machine.create_authorities:
        return _reject(
            Code.UNAUTHORIZED,
            f"{principal.authority} ({principal.source}) may not create '{machine.name}' runs; "
            f"allowed: {', '.join(sorted(machine.create_authorities))}",
            proposal,
            principal,
            None,
            now_ms,
        )

    over = _over_ceilings(machine, create) or _waived_criteria(machine, create)
    if over is not None:
        return _reject(Code.LIMIT_EXCEEDED, over, proposal, principal, None, now_ms)
    if create.continues is not None:
        too_large = oversized(create.checkpoint)
        if too_large is not None:
            return _reject(Code.CHECKPOINT_TOO_LARGE, too_large, proposal, principal, None, now_ms)
        # The original decides whether it is carried on (a processor's create, as a
        # replay's, stands as committed).
        if not granted and (scope is None or not scope.processor):
            return Relay(continuation.ask(proposal, principal, scope, create))

    options = create.options
    spec = machine.spec
    default_retries = spec.retry.default_max_retries if spec.retry is not None else 0
    criteria = options.success_criteria
    values: dict[str, Any] = {
        "schema_version": 1,
        "run_id": proposal.run_id,
        "machine": machine.name,
        "machine_version": machine.version,
        "state": spec.initial,
        "revision": 0,
        "retry_count": 0,
        "max_retries": default_retries if options.max_retries is None else options.max_retries,
        "success_criteria": (spec.default_success_criteria if criteria is None else list(criteria)),
        "deadlines": options.deadlines or _NO_DEADLINES,
        "facts": [],
        "steps": {
            name: StepRecord.trusted(
                {
                    "status": StepStatus(step.status),
                    "idempotency_key": step.idempotency_key,
                    "attempts": step.attempts,
                    "result": step.result,
                    "error": None,
                    "revision": 0,
                    "call_id": None,
                }
            )
            for name, step in create.steps.items()
        },
        "checkpoint": create.checkpoint,
        "continues": create.continues,
        "recent_proposals": {proposal.proposal_id: 0},
        "heartbeat_at_ms": None,
        "stop_reason": None,
        "last_reason": proposal.reason,
        "timers": [],
        "last_hash": "",
        "created_at_ms": now_ms,
        "updated_at_ms": now_ms,
        "entered_state_at_ms": now_ms,
        "pause": None,
        "fact_sources": {},
        "heartbeat_id": None,
        "heartbeat_signed_at_ms": None,
        "finished_by": None,
        "continued_by": None,
    }
    return _seal(machine, values, None, proposal, principal, now_ms)


def _decide_migrate(
    machines: Mapping[str, Machine],
    machine: Machine,
    snapshot: RunSnapshot,
    proposal: Proposal,
    principal: Principal,
    now_ms: int,
    scope: Scope | None,
) -> Decision:
    """Move the run to another version of its machine, explicitly: the only way a run
    changes version; by the machine's `migrate_authorities` with an operator's key."""
    target_version = proposal.payload.get("version")
    if not isinstance(target_version, str) or set(proposal.payload) != {"version"}:
        return _reject(
            Code.SCHEMA_INVALID,
            'payload of \'migrate\' is {"version": "<machine version>"}',
            proposal,
            principal,
            snapshot,
            now_ms,
        )
    if principal.authority not in machine.spec.migrate_authorities:
        return _reject(
            Code.UNAUTHORIZED,
            f"{principal.authority} ({principal.source}) may not migrate '{machine.name}' runs; "
            f"allowed: {', '.join(sorted(machine.spec.migrate_authorities))}",
            proposal,
            principal,
            snapshot,
            now_ms,
        )
    if scope is None or not scope.operator:  # None: a key without limits, no operator's
        return _reject(
            Code.UNAUTHORIZED,
            f"{principal.authority} ({principal.source}) may not migrate runs with this key: "
            "moving a run to another machine version takes an operator's key "
            '(keyring "operator": true; `runstate keys add --operator`)',
            proposal,
            principal,
            snapshot,
            now_ms,
        )
    stale = _stale_or_finished(machine, snapshot, proposal, principal, now_ms)
    if stale is not None:
        return stale
    target = machine_for(machines, machine.name, target_version)
    if target is None:
        return _reject(
            Code.UNKNOWN_MACHINE,
            f"no version {target_version} of machine '{machine.name}' is held here; "
            "publish it first (runstate machines publish)",
            proposal,
            principal,
            snapshot,
            now_ms,
        )
    problems = _incompatibilities(target, snapshot)
    if problems:
        return _reject(
            Code.INCOMPATIBLE_VERSION,
            f"cannot move the run to version {target.version}: {'; '.join(problems)}",
            proposal,
            principal,
            snapshot,
            now_ms,
        )
    migrated = snapshot.model_copy(update={"machine_version": target.version})
    return _commit(target, migrated, proposal, principal, now_ms, snapshot.state)


def _decide_forget(
    machine: Machine, snapshot: RunSnapshot, proposal: Proposal, principal: Principal, now_ms: int
) -> Decision:
    """Forget a finished run once its machine's retention has passed since it finished.
    Proposed by the worker's retention timer; time decides, as for every deadline."""
    if principal.authority != TIMER_AUTHORITY:
        return _reject(
            Code.UNAUTHORIZED,
            f"{principal.authority} ({principal.source}) may not send 'forget'; runs are "
            f"forgotten by the {TIMER_AUTHORITY}'s retention timer",
            proposal,
            principal,
            snapshot,
            now_ms,
        )
    stale = _stale(snapshot, proposal, principal, now_ms)
    if stale is not None:
        return stale
    retention = machine.spec.retention_ms
    why = None
    if snapshot.state not in machine.terminal:
        why = f"only a finished run is forgotten; run is in '{snapshot.state}'"
    elif retention is None:
        why = f"machine '{machine.name}' keeps finished runs for ever (no retention_ms)"
    elif now_ms < snapshot.entered_state_at_ms + retention:
        why = f"the run is kept until {snapshot.entered_state_at_ms + retention}"
    if why is not None:
        return _reject(Code.INVALID_TRANSITION, why, proposal, principal, snapshot, now_ms)
    return Forget(
        _commit(machine, snapshot, proposal, principal, now_ms, snapshot.state).transition
    )


def _decide_relayed(
    machines: Mapping[str, Machine],
    snapshot: RunSnapshot | None,
    proposal: Proposal,
    principal: Principal,
    now_ms: int,
    seen: Callable[[str], Answer | None] | None,
    scope: Scope | None,
) -> Decision:
    """A message the workers send between runs (processor/engine/continuation.py): taken
    from a processor key only, whatever the run."""
    if scope is None or not scope.processor:
        return _reject(
            Code.UNAUTHORIZED,
            f"'{proposal.event}' is sent between runs by the workers, with a processor key "
            f'(keyring "processor": true); {principal.authority} ({principal.source}) may '
            "not send it",
            proposal,
            principal,
            None,
            now_ms,
        )
    if proposal.event == continuation.CONTINUED_BY:
        return _decide_continued_by(machines, snapshot, proposal, principal, now_ms, seen)
    if proposal.event == continuation.UNDONE:
        return _decide_undone(machines, snapshot, proposal, principal, now_ms, seen)
    try:
        answer = ContinuationAnswer.model_validate(proposal.payload)
    except ValidationError as exc:
        why = f"payload of '{proposal.event}': {describe_errors(exc)}"
        return _reject(Code.SCHEMA_INVALID, why, proposal, principal, None, now_ms)
    create = answer.create
    if create.run_id != proposal.run_id or create.event != CREATE_EVENT:
        why = f"'{proposal.event}' carries no create of run '{proposal.run_id}'"
        return _reject(Code.SCHEMA_INVALID, why, proposal, principal, None, now_ms)
    if proposal.event == continuation.REFUSED and snapshot is None:
        code = answer.code or Code.CONTINUATION_REFUSED
        detail = answer.detail or "the original run refused to be continued"
        return _reject(code, detail, create, answer.principal, None, now_ms)
    # Decided as the asking create, with the asking key's scope (a run there by now
    # refuses it as it would any create, telling a key out of its scope nothing).
    scope = continuation.asking_scope(answer.key_id, answer.machines)
    decided = _decide_create(
        machines, snapshot, create, answer.principal, now_ms, seen, scope, granted=True
    )
    if (
        proposal.event == continuation.GRANTED
        and isinstance(decided, Rejection)
        and decided.code is not Code.DUPLICATE  # the very create, committed before
    ):
        # The original named this run, which does not continue it: it is told to forget.
        return Relay(continuation.undo(create), decided)
    return decided


def _decide_continued_by(
    machines: Mapping[str, Machine],
    snapshot: RunSnapshot | None,
    proposal: Proposal,
    principal: Principal,
    now_ms: int,
    seen: Callable[[str], Answer | None] | None,
) -> Decision:
    """The original run takes a continuation or refuses it (`continuation.refusal`).
    Taken: a transition naming the new run (the state stays) and the grant to send.
    Refused: the refusal to send; nothing is recorded here. A transition decided again
    (replay) carries no create: it commits as recorded, or is refused here."""
    try:
        asked = ContinuationAsk.model_validate(proposal.payload)
    except ValidationError as exc:
        why = f"payload of '{proposal.event}': {describe_errors(exc)}"
        return _reject(Code.SCHEMA_INVALID, why, proposal, principal, None, now_ms)
    if snapshot is not None:
        answered = _answer(snapshot, proposal.proposal_id, seen)
        if answered is not None:  # asked again (the create was resent): granted once
            digest = digest_of(continuation.recorded(proposal), principal)
            return _answered_again(proposal, principal, snapshot, answered, digest, now_ms)
    machine = (
        None
        if snapshot is None
        else machine_for(machines, snapshot.machine, snapshot.machine_version)
    )
    refused: tuple[Code, str] | None
    if snapshot is None:
        refused = (
            Code.UNKNOWN_RUN,
            f"run '{proposal.run_id}' does not exist (or its retention has passed): there "
            "is nothing to continue",
        )
    else:
        refused = continuation.refusal(machine, snapshot, asked)
    if refused is not None:
        if asked.create is None:
            return _reject(*refused, proposal, principal, None, now_ms)
        return Relay(continuation.answer(asked, *refused))
    assert machine is not None and snapshot is not None
    commit = _recorded_on_original(
        machine, snapshot, continuation.recorded(proposal), principal, now_ms, asked.run_id
    )
    if asked.create is None:
        return commit
    return Commit(commit.snapshot, commit.transition, None, (continuation.answer(asked),))


def _decide_undone(
    machines: Mapping[str, Machine],
    snapshot: RunSnapshot | None,
    proposal: Proposal,
    principal: Principal,
    now_ms: int,
    seen: Callable[[str], Answer | None] | None,
) -> Decision:
    """The run this one took as its continuation refused the create after all (a run of
    that id was there by then, or the create did not fit): this run no longer names it,
    and may be continued again. Its id is the continuation's, so it is taken once."""
    try:
        undone = ContinuationUndo.model_validate(proposal.payload)
    except ValidationError as exc:
        why = f"payload of '{proposal.event}': {describe_errors(exc)}"
        return _reject(Code.SCHEMA_INVALID, why, proposal, principal, None, now_ms)
    if snapshot is None:
        why = f"run '{proposal.run_id}' does not exist: there is no continuation to undo"
        return _reject(Code.UNKNOWN_RUN, why, proposal, principal, None, now_ms)
    answered = _answer(snapshot, proposal.proposal_id, seen)
    if answered is not None:
        digest = digest_of(proposal, principal)
        return _answered_again(proposal, principal, snapshot, answered, digest, now_ms)
    machine = machine_for(machines, snapshot.machine, snapshot.machine_version)
    if machine is None:
        why = f"run '{proposal.run_id}' uses a machine version this worker does not hold"
        return _reject(Code.UNKNOWN_MACHINE, why, proposal, principal, snapshot, now_ms)
    if snapshot.continued_by != undone.run_id:
        why = f"run '{proposal.run_id}' is not continued by run '{undone.run_id}'"
        return _reject(Code.INVALID_TRANSITION, why, proposal, principal, snapshot, now_ms)
    return _recorded_on_original(machine, snapshot, proposal, principal, now_ms, None)


def _recorded_on_original(
    machine: Machine,
    snapshot: RunSnapshot,
    proposal: Proposal,
    principal: Principal,
    now_ms: int,
    continued_by: str | None,
) -> Commit:
    """A finished run's transition naming its continuation (or no more): its state,
    stop reason and last reason stay as they were."""
    continued = snapshot.model_copy(update={"continued_by": continued_by})
    commit = _commit(
        machine,
        continued,
        proposal,
        principal,
        now_ms,
        snapshot.state,
        stop_reason=snapshot.stop_reason,
    )
    kept = commit.snapshot.model_copy(update={"last_reason": snapshot.last_reason})
    return Commit(kept, commit.transition)


def _incompatibilities(target: Machine, snapshot: RunSnapshot) -> list[str]:
    """Why the run could not go on under `target`: its state is not there, or a deadline
    it has pending could not be decided there."""
    state = snapshot.state
    if state not in target.spec.states:
        return [f"state '{state}' does not exist in it"]
    problems = []
    for timer in snapshot.timers:
        if timer.kind == "deadline" and timer.event is not None:
            if (state, timer.event) not in target.edges:
                problems.append(
                    f"the pending {timer.name} deadline proposes '{timer.event}', which has "
                    f"no transition from '{state}' there"
                )
        elif (
            timer.kind == "alert"
            and timer.name != APPROVAL_REMINDER
            and not any(a.rule == timer.name for a in target.spec.alerts)
        ):
            problems.append(f"the pending alert '{timer.name}' does not exist there")
    return problems


def _commit(
    machine: Machine,
    snapshot: RunSnapshot,
    proposal: Proposal,
    principal: Principal,
    now_ms: int,
    target: str,
    *,
    retry_count: int | None = None,
    facts: list[str] | None = None,
    fact_sources: dict[str, FactSource] | None = None,
    steps: dict[str, StepRecord] | None = None,
    checkpoint: dict[str, Any] | None = None,
    stop_reason: str | None = None,
) -> Commit:
    revision = snapshot.revision + 1
    # copy() clones the table as it is (dict() re-inserts every key of a dict that
    # has had a key deleted, as this one has once the window is full: 3x slower).
    recent = snapshot.recent_proposals.copy()
    recent[proposal.proposal_id] = revision
    if len(recent) > machine.dedupe_window:
        del recent[next(iter(recent))]  # oldest first: dicts keep insertion order
    values = dict(snapshot.__dict__)
    values["state"] = target
    values["revision"] = revision
    values["recent_proposals"] = recent
    values["heartbeat_at_ms"] = None  # the commit itself is the latest sign of life
    values["heartbeat_id"] = values["heartbeat_signed_at_ms"] = None
    values["stop_reason"] = stop_reason
    values["last_reason"] = proposal.reason
    values["updated_at_ms"] = now_ms
    if retry_count is not None:
        values["retry_count"] = retry_count
    if facts is not None:
        values["facts"] = facts
    if fact_sources is not None:
        values["fact_sources"] = fact_sources
    if steps is not None:
        values["steps"] = steps
    if checkpoint is not None:
        values["checkpoint"] = checkpoint
    if target != snapshot.state:
        values["entered_state_at_ms"] = now_ms
        values["finished_by"] = principal if target in machine.terminal else None
        values["pause"] = (
            Pause.trusted({"revision": revision, "asked_by": principal, "at_ms": now_ms})
            if target in machine.approval_states
            else None
        )
    return _seal(
        machine, values, snapshot.state, proposal, principal, now_ms, snapshot.heartbeat_at_ms
    )


def _beat(
    machine: Machine,
    snapshot: RunSnapshot,
    proposal: Proposal,
    principal: Principal,
    now_ms: int,
    signed_at_ms: int | None,
) -> Beat:
    """The heartbeat's snapshot: the same run, alive at `now_ms`."""
    alive = alive_at(
        machine,
        snapshot,
        max(now_ms, snapshot.heartbeat_at_ms or now_ms),
        heartbeat_id=proposal.proposal_id,
        heartbeat_signed_at_ms=signed_at_ms,
    )
    deadline = next(
        (t.due_at_ms for t in alive.timers if t.kind == "deadline" and t.name == "heartbeat"),
        None,
    )
    heartbeat = Heartbeat.trusted(
        dict(
            schema_version=1,
            run_id=snapshot.run_id,
            proposal_id=proposal.proposal_id,
            machine=snapshot.machine,
            state=snapshot.state,
            revision=snapshot.revision,
            principal=principal,
            at_ms=now_ms,
            deadline_ms=deadline,
            signed_at_ms=signed_at_ms,
        )
    )
    return Beat(alive, heartbeat)


def alive_at(
    machine: Machine,
    snapshot: RunSnapshot,
    heartbeat_at_ms: int | None,
    *,
    heartbeat_id: str | None = None,
    heartbeat_signed_at_ms: int | None = None,
) -> RunSnapshot:
    """The run with its latest heartbeat at `heartbeat_at_ms` and its timers armed again
    from it: only the heartbeat deadline moves, the others keep their due times.
    `heartbeat_id` and `heartbeat_signed_at_ms` name the heartbeat taken, when one is."""
    values = dict(snapshot.__dict__)
    values["heartbeat_at_ms"] = heartbeat_at_ms
    if heartbeat_id is not None:
        values["heartbeat_id"] = heartbeat_id
        if heartbeat_signed_at_ms is not None:
            values["heartbeat_signed_at_ms"] = heartbeat_signed_at_ms
    values["timers"] = _armed(machine, values)
    return RunSnapshot.trusted(values)


def _seal(
    machine: Machine,
    values: dict[str, Any],
    from_state: str | None,
    proposal: Proposal,
    principal: Principal,
    now_ms: int,
    heartbeat_at_ms: int | None = None,
) -> Commit:
    """The transition for the run's next `values`, chained to the previous one by hash,
    and the snapshot with its hash and newly armed timers. `heartbeat_at_ms` is the
    liveness the decision saw (the transition records it: the time checks used it)."""
    transition: dict[str, Any] = {
        "schema_version": 1,
        "transition_id": f"{values['run_id']}:{values['revision']}",
        "run_id": values["run_id"],
        "machine": values["machine"],
        "machine_version": values["machine_version"],
        "revision": values["revision"],
        "from_state": from_state,
        "to_state": values["state"],
        "event": proposal.event,
        "proposal_id": proposal.proposal_id,
        "principal": principal,
        "reason": proposal.reason,
        "payload": proposal.payload,
        "metadata": proposal.metadata,
        "retry_count": values["retry_count"],
        "at_ms": now_ms,
        "prev_hash": values["last_hash"],
        "heartbeat_at_ms": heartbeat_at_ms,
    }
    transition["hash"] = values["last_hash"] = transition_hash(transition)
    values["timers"] = _armed(machine, values)
    return Commit(RunSnapshot.trusted(values), Transition.trusted(transition))


def _armed(machine: Machine, values: dict[str, Any]) -> list[Timer]:
    deadlines = values["deadlines"]
    if (
        values["state"] in machine.quiet_states
        and deadlines.approval_timeout_ms is None
        and deadlines.heartbeat_timeout_ms is None
    ):
        return []
    return arm_timers(
        machine,
        run_id=values["run_id"],
        state=values["state"],
        revision=values["revision"],
        entered_state_at_ms=values["entered_state_at_ms"],
        updated_at_ms=values["updated_at_ms"],
        heartbeat_at_ms=values["heartbeat_at_ms"],
        retry_count=values["retry_count"],
        max_retries=values["max_retries"],
        deadlines=deadlines,
    )


def _failed_guard(edge: Edge, snapshot: RunSnapshot) -> str | None:
    for guard in edge.guards:
        if guard.kind is GuardKind.SUCCESS_CRITERIA:
            missing = [c for c in snapshot.success_criteria if c not in snapshot.facts]
            if missing:
                return f"success criteria not met: missing {', '.join(missing)}"
        elif guard.kind is GuardKind.FACTS_PRESENT:
            missing = [f for f in guard.facts if f not in snapshot.facts]
            if missing:
                return f"required facts missing: {', '.join(missing)}"
        elif guard.kind is GuardKind.STEPS_SETTLED:
            executing = executing_steps(snapshot)
            if executing:
                return (
                    f"steps still executing: {', '.join(executing)}; settle each "
                    "(step_succeeded, or step_failed with what you found) first"
                )
        elif snapshot.retry_count < snapshot.max_retries:  # RETRIES_EXHAUSTED
            return (
                f"retry budget not spent ({snapshot.retry_count} of {snapshot.max_retries} used); "
                "retry instead"
            )
    return None


def _overdue_deadline(machine: Machine, snapshot: RunSnapshot, now_ms: int) -> Timer | None:
    """The earliest timeout of the run (approval, heartbeat) due at or before `now_ms`.

    Time decides, not when the worker gets round to it: a proposal whose broker time is
    at or after a timeout is decided after that timeout, whether or not the worker has
    fired it yet (it may have been down). Only a timeout whose edge exists and whose
    guards hold counts, so one that could never commit cannot freeze the run. The retry
    backoff is a schedule, not an expiry: proposals in its state are decided as they come."""
    found: Timer | None = None
    for timer in snapshot.timers:
        if timer.name not in EXPIRING or timer.due_at_ms > now_ms or timer.event is None:
            continue
        if found is not None and found.due_at_ms <= timer.due_at_ms:
            continue
        edge = machine.edges.get((snapshot.state, timer.event))
        if edge is not None and (not edge.guards or _failed_guard(edge, snapshot) is None):
            found = timer
    return found


def _unripe_deadline(
    machine: Machine, snapshot: RunSnapshot, edge: Edge, proposal: Proposal, now_ms: int
) -> str | None:
    """Why a proposal may not take a deadline's edge: it claims one of the state's
    deadlines (the deadline's event with the reason it gives; for an approval wait, the
    deadline's event with any reason its edge allows) and that deadline is not due at
    the proposal's time, or not armed for this run at all. A deadline is the processor's
    to propose once it falls due: a principal that may send the event cannot end an
    approval wait (or declare a run stale) early by saying the time is up."""
    timeouts = machine.deadline_edges.get((edge.source, edge.event))
    if timeouts is None:
        return None
    claimed = {
        timeout.kind
        for timeout in timeouts
        if (
            (timeout.reason is not None and timeout.reason == proposal.reason)
            # An approval wait is left by a decision or its deadline: its deadline's edge
            # is the deadline's, unless the edge names other reasons to take it.
            or (timeout.kind == "approval" and edge.reasons <= {timeout.reason})
        )
    }
    if not claimed:
        return None
    armed = [
        timer
        for timer in snapshot.timers
        if timer.kind == "deadline" and timer.name in claimed and timer.event == edge.event
    ]
    if any(timer.due_at_ms <= now_ms for timer in armed):
        return None
    names = " or ".join(sorted(claimed))
    when = (
        f"falls due at {min(timer.due_at_ms for timer in armed)}"
        if armed
        else "is not armed for this run"
    )
    return (
        f"'{edge.event}' from '{edge.source}'"
        + (f" with reason '{proposal.reason}'" if proposal.reason is not None else "")
        + f" is the run's {names} deadline, which {when} (this proposal: {now_ms}); the "
        "processor proposes it once it is due. To end the run earlier, send an event of "
        "your own that leaves this state"
    )


def _stale_or_finished(
    machine: Machine, snapshot: RunSnapshot, proposal: Proposal, principal: Principal, now_ms: int
) -> Rejection | None:
    """`_stale`, else terminal_state when the run is finished."""
    stale = _stale(snapshot, proposal, principal, now_ms)
    if stale is not None:
        return stale
    if snapshot.state in machine.terminal:
        return _reject(
            Code.TERMINAL_STATE,
            f"run is in terminal state '{snapshot.state}' and never changes"
            + _within_grace(machine, snapshot, proposal, now_ms),
            proposal,
            principal,
            snapshot,
            now_ms,
        )
    return None


def _within_grace(machine: Machine, snapshot: RunSnapshot, proposal: Proposal, now_ms: int) -> str:
    """What a decision that came within an approval deadline's grace period may do, when
    it did: the run failed by the deadline, so it is continued by a new run."""
    rule = machine.rules.get(proposal.event)
    if (
        rule is None
        or not isinstance(rule.payload_model, type)
        or rule.payload_model is not ApprovalPayload
    ):
        return ""
    for timeout in machine.spec.timeouts:
        grace = timeout.grace_ms
        ended = snapshot.stop_reason in (timeout.reason, timeout.event)
        if (
            timeout.kind == "approval"
            and grace is not None
            and ended
            and now_ms < snapshot.entered_state_at_ms + grace
        ):
            return (
                f"; this decision came within the approval deadline's grace period "
                f"({grace} ms): continue the run from its checkpoint as a new run "
                "(create with continues; runstate resume shows what it carries)"
            )
    return ""


def _stale(
    snapshot: RunSnapshot, proposal: Proposal, principal: Principal, now_ms: int
) -> Rejection | None:
    """revision_conflict when the proposal was made against another state of the run: its
    expected revision, or a deadline a heartbeat moved since."""
    if proposal.expected_revision is not None and proposal.expected_revision != snapshot.revision:
        return _reject(
            Code.REVISION_CONFLICT,
            f"expected revision {proposal.expected_revision} but the run is at "
            f"{snapshot.revision}; read the run again and re-decide",
            proposal,
            principal,
            snapshot,
            now_ms,
        )
    # Only a proposal whose metadata names a timer can be a stale deadline.
    moved = _moved_deadline(snapshot, proposal, now_ms) if proposal.metadata else None
    if moved is not None:
        return _reject(Code.REVISION_CONFLICT, moved, proposal, principal, snapshot, now_ms)
    return None


def _borrowed_id(proposal: Proposal, principal: Principal) -> str | None:
    """Why a proposal may not use its id: one of a deadline's, or of a message the
    workers send between runs (those take their own path, `_decide_relayed`)."""
    if proposal.proposal_id.startswith(continuation.RELAY_ID_PREFIX):
        return (
            f"proposal ids beginning '{continuation.RELAY_ID_PREFIX}' are those of the "
            "messages the workers send between runs; choose another id"
        )
    return _borrowed_timer_id(proposal, principal)


def _borrowed_timer_id(proposal: Proposal, principal: Principal) -> str | None:
    """Why a proposal may not use its id, when it is a deadline's (`timer:...`) and the
    proposal is not that deadline: the runtime's, expecting the revision and naming the
    timer the id is made of. Else a proposal sent first with the id of a deadline to come
    would make that deadline a `duplicate`, and the run would wait for it for ever. A
    proposal that is the deadline may commit it only where the deadline would: at the
    revision the id names, so the deadline that arrives after it is stale anyway. No
    deadline is a `create` (a creation at revision 0 would leave the run at the revision
    of a deadline its machine arms there)."""
    proposal_id = proposal.proposal_id
    if not proposal_id.startswith(TIMER_ID_PREFIX):
        return None
    name, revision = proposal.metadata.get("timer"), proposal.expected_revision
    if (
        proposal.event != CREATE_EVENT
        and principal.authority == TIMER_AUTHORITY
        and isinstance(name, str)
        and revision is not None
        and proposal_id == timer_proposal_id(proposal.run_id, revision, name)
    ):
        return None
    return (
        f"proposal ids beginning '{TIMER_ID_PREFIX}' are those of the processor's deadlines "
        f"({TIMER_ID_PREFIX}<run>:<revision>:<timer>, sent by the {TIMER_AUTHORITY} with "
        "that expected revision and metadata.timer); choose another id"
    )


def _moved_deadline(snapshot: RunSnapshot, proposal: Proposal, now_ms: int) -> str | None:
    """Why a deadline the processor proposed no longer holds, if it does not: the timer
    it names has been moved past the proposal's time (a heartbeat came in after the
    timer was armed; a transition would already have failed its expected revision).
    Metadata is the sender's free-form JSON: `timer` may be any value."""
    name = proposal.metadata.get("timer")
    if not isinstance(name, str) or name not in EXPIRING:
        return None
    armed = next((t for t in snapshot.timers if t.kind == "deadline" and t.name == name), None)
    if armed is None or armed.due_at_ms <= now_ms:
        return None
    return (
        f"the run's {name} deadline moved to {armed.due_at_ms} (a heartbeat came in after "
        f"it was armed); this deadline proposal ({now_ms}) is stale"
    )


def _answer(
    snapshot: RunSnapshot, proposal_id: str, seen: Callable[[str], Answer | None] | None
) -> Answer | None:
    """What the run answered `proposal_id` before, if it did: `seen` knows every answer
    of the run's life; the snapshot keeps its latest commits (all a caller without a
    store has)."""
    if seen is not None:
        answer = seen(proposal_id)
        if answer is not None:
            return answer
    revision = snapshot.recent_proposals.get(proposal_id)
    return None if revision is None else Answer(revision, None)


def _answered_again(
    proposal: Proposal,
    principal: Principal,
    snapshot: RunSnapshot,
    answer: Answer,
    digest: str,
    now_ms: int,
) -> Rejection:
    """The first answer again for the same proposal; `proposal_id_reused` for another
    one under its id, which tells nothing of the first answer but its kind."""
    if answer.digest is not None and answer.digest != digest:
        return _reject(
            Code.PROPOSAL_ID_REUSED,
            f"proposal id '{proposal.proposal_id}' was already {answer.kind} for another "
            "proposal (other content or principal); every proposal needs an id of its own",
            proposal,
            principal,
            None,
            now_ms,
        )
    if answer.rejection is not None:
        return answer.rejection
    assert answer.revision is not None
    original_id = transition_id(snapshot.run_id, answer.revision)
    return _reject(
        Code.DUPLICATE,
        f"proposal '{proposal.proposal_id}' was already committed as {original_id}",
        proposal,
        principal,
        snapshot,
        now_ms,
        original_transition_id=original_id,
    )


def _replayed_heartbeat(
    snapshot: RunSnapshot, proposal: Proposal, signed_at_ms: int | None
) -> str | None:
    """Why a heartbeat is not taken, when it is one taken already, or signed no later
    than the latest heartbeat taken or before the run's latest transition: a replayed
    heartbeat would otherwise push the run's deadline out. (The transition is itself
    the run's latest sign of life, so an honest heartbeat lost to this loses nothing.)"""
    if proposal.proposal_id == snapshot.heartbeat_id:
        return f"heartbeat '{proposal.proposal_id}' was already taken"
    if signed_at_ms is None:
        return None
    latest = snapshot.heartbeat_signed_at_ms
    if latest is not None and signed_at_ms <= latest:
        return (
            f"heartbeat signed at {signed_at_ms}, not after the latest taken (signed at "
            f"{latest}): a replay, or sent out of order; it moves no deadline"
        )
    if signed_at_ms < snapshot.updated_at_ms:
        return (
            f"heartbeat signed at {signed_at_ms}, before the run's latest transition "
            f"({snapshot.updated_at_ms}): a replay, or sent late; it moves no deadline"
        )
    return None


def _unbound_approval(
    snapshot: RunSnapshot, payload: ApprovalPayload, principal: Principal, now_ms: int
) -> tuple[Code, str] | None:
    """Why an approver's decision does not answer the run's pause, if it does not."""
    pause = snapshot.pause
    # A run that entered its wait before pauses were recorded: the wait's revision is
    # the run's (nothing commits inside a wait of the built-in machines).
    revision = snapshot.revision if pause is None else pause.revision
    if payload.pause != revision:
        return (
            Code.APPROVAL_WRONG_PAUSE,
            f"the decision answers the pause entered at revision {payload.pause}; the run "
            f"waits in the pause entered at revision {revision}: decide on that one",
        )
    if payload.expires_at_ms <= now_ms:
        return (
            Code.APPROVAL_EXPIRED,
            f"the decision expired at {payload.expires_at_ms}, before it was appended "
            f"({now_ms}); decide again",
        )
    if pause is not None and pause.asked_by.source == principal.source:
        return (
            Code.SELF_APPROVAL,
            f"{principal.source} asked for this approval and may not decide it; another "
            "principal with the approver role must",
        )
    return None


def _over_ceilings(machine: Machine, create: CreatePayload) -> str | None:
    """Why a creation's chosen limits are beyond the machine's ceilings, if they are."""
    ceilings = machine.spec.ceilings
    if ceilings is None:  # a version written before ceilings: it had none
        return None
    options = create.options
    if options.max_retries is not None and options.max_retries > ceilings.max_retries:
        return f"max_retries {options.max_retries} is over the ceiling {ceilings.max_retries}"
    criteria = options.success_criteria
    if criteria is not None and len(criteria) > ceilings.max_success_criteria:
        return (
            f"{len(criteria)} success criteria are over the ceiling {ceilings.max_success_criteria}"
        )
    deadlines = options.deadlines
    if deadlines is not None:
        for name, value in deadlines.__dict__.items():
            if value is not None and value > ceilings.max_timeout_ms:
                return f"{name} {value} is over the ceiling {ceilings.max_timeout_ms} ms"
    return None


def _waived_criteria(machine: Machine, create: CreatePayload) -> str | None:
    """Why a creation's success criteria leave out some of its machine's, if they do: a
    run adds criteria to what its machine calls success, never waives them (its creator
    is the principal that later says it succeeded)."""
    criteria = create.options.success_criteria
    if criteria is None:
        return None
    missing = [c for c in machine.spec.default_success_criteria if c not in criteria]
    if not missing:
        return None
    return (
        f"success_criteria leave out the machine's own ({', '.join(missing)}): a run may add "
        f"criteria to those of '{machine.name}', not drop them"
    )


def executing_steps(snapshot: RunSnapshot) -> list[str]:
    return sorted(n for n, r in snapshot.steps.items() if r.status is StepStatus.EXECUTING)


def refused(
    code: Code, detail: str, proposal: Proposal, principal: Principal, now_ms: int
) -> Rejection:
    """`proposal`'s refusal, telling nothing of its run, as the shell makes one (a
    continuation's ask that cannot be sent)."""
    return _reject(code, detail, proposal, principal, None, now_ms)


def _reject(
    code: Code,
    detail: str,
    proposal: Proposal,
    principal: Principal,
    snapshot: RunSnapshot | None,
    now_ms: int,
    *,
    original_transition_id: str | None = None,
    step_result: Any = None,
) -> Rejection:
    return Rejection.trusted(
        dict(
            schema_version=1,
            code=code,
            detail=detail,
            run_id=proposal.run_id,
            proposal_id=proposal.proposal_id,
            event=proposal.event,
            principal=principal,
            state=None if snapshot is None else snapshot.state,
            revision=None if snapshot is None else snapshot.revision,
            original_transition_id=original_transition_id,
            step_result=step_result,
            content_digest=None,
            at_ms=now_ms,
        )
    )
