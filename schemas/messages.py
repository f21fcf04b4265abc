"""Wire messages: what producers propose and what the processor publishes and stores."""

from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import Field, JsonValue, model_validator

from schemas.base import VersionedMessage, WireModel
from schemas.codes import RejectionCode
from schemas.identifiers import Name, ProposalId, RunId
from schemas.ijson import ExactJsonObject

Reason = Annotated[str, Field(min_length=1, max_length=256)]
JsonObject = dict[str, JsonValue]


class Principal(WireModel):
    """Who said it, as proven by a credential: never read from a proposal's payload."""

    source: str = Field(description="The concrete producer, e.g. 'runtime' or 'tool:get_status'.")
    authority: str = Field(description="The write boundary: runtime, tool_executor, model, ...")


class Proposal(VersionedMessage):
    """A request to change a run. The processor commits it as a transition or refuses it."""

    proposal_id: ProposalId
    run_id: RunId
    event: Name = Field(description="'create', a step event, or an event of the run's machine.")
    expected_revision: int | None = Field(
        default=None, ge=0, description="Optimistic check: refused unless the run is at it."
    )
    reason: Reason | None = None
    # Both are hashed into the transition: integers only as large as RFC 8785 takes.
    payload: ExactJsonObject = Field(
        default_factory=dict,
        description="Event data; typed for create, facts and steps. Integers within "
        "±(2**53-1) (I-JSON).",
    )
    metadata: ExactJsonObject = Field(
        default_factory=dict,
        description="Free-form context copied onto the transition. Integers within "
        "±(2**53-1) (I-JSON).",
    )


class Deadlines(WireModel):
    """Time limits of one run, in milliseconds; fired by the processor, not by agents."""

    approval_timeout_ms: int | None = Field(default=None, gt=0)
    heartbeat_timeout_ms: int | None = Field(default=None, gt=0)
    retry_backoff_ms: int | None = Field(default=None, gt=0)


class RunOptions(WireModel):
    """Per-run settings given at creation; unset ones take the machine's defaults."""

    max_retries: int | None = Field(default=None, ge=0)
    success_criteria: list[str] | None = None
    deadlines: Deadlines | None = None


class RunLink(WireModel):
    """Another run, as it stood at one revision: the run a continuation carries on from.
    `revision` and `hash` name the predecessor's latest transition when it was read, so
    anyone holding its transitions can check what was carried (`processor.history.resume`)."""

    run_id: RunId
    revision: int = Field(ge=0)
    hash: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="`hash` of the predecessor's transition at `revision`."
    )


class CarriedStep(WireModel):
    """A step of a predecessor run, carried into its continuation: one it completed
    (`succeeded`, with its result), or one it left `executing`, whose outcome is unknown:
    the continuation starts with it executing, to be settled (by someone who checked the
    outside world) before it runs again."""

    status: Literal["succeeded", "executing"] = "succeeded"
    idempotency_key: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    attempts: int = Field(default=1, ge=1)
    result: JsonValue = None

    @model_validator(mode="after")
    def _a_result_only_when_succeeded(self) -> Self:
        if self.status == "executing" and self.result is not None:
            raise ValueError("an executing step has no result yet")
        return self


class CreatePayload(WireModel):
    """The payload of a `create` proposal. With `continues`, the new run carries on from
    a finished one: it starts with the predecessor's succeeded and executing `steps` and
    its `checkpoint`, read from the predecessor's snapshot by whoever creates it, and taken
    only when the predecessor agrees they are its own (docs/contract.md §4)."""

    machine: Name
    options: RunOptions = Field(default_factory=RunOptions)
    continues: RunLink | None = None
    steps: dict[Name, CarriedStep] = Field(
        default_factory=dict,
        description="Only with `continues`: the steps it completed, and those it left executing.",
    )
    checkpoint: JsonObject = Field(
        default_factory=dict, description="Only with `continues`: its checkpoint data."
    )

    @model_validator(mode="after")
    def _carried_only_with_a_predecessor(self) -> Self:
        if self.continues is None and (self.steps or self.checkpoint):
            raise ValueError("'steps' and 'checkpoint' are carried only with 'continues'")
        return self


class ContinuationAsk(WireModel):
    """The payload of `continued_by`, which a worker sends to a finished run when a
    `create` asks to continue it: what the new run claims to carry, as digests, for the
    original to check against its own snapshot. `create` is the asking proposal itself,
    carried on to the new run when the original takes it; the original's transition
    records the rest (no need to keep the carried data twice)."""

    run_id: RunId = Field(description="The new run, which continues this one.")
    proposal_id: ProposalId = Field(description="The new run's `create` proposal.")
    principal: Principal = Field(description="Who asked to continue, as proven.")
    key_id: str | None = Field(
        default=None, description="The key the asking proposal was signed with, if limited."
    )
    machines: list[str] | None = Field(
        default=None, description="That key's machines, when it is limited to some."
    )
    revision: int = Field(ge=0, description="The revision the new run says it read.")
    hash: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    steps_digest: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    checkpoint_digest: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    create: Proposal | None = Field(
        default=None, description="The asking `create`; not recorded in the transition."
    )


class ContinuationAnswer(WireModel):
    """The payload of `continuation_granted` and `continuation_refused`, which a worker
    sends back to the new run: its `create` (decided then, as that proposal) and, when
    refused, why."""

    create: Proposal
    principal: Principal
    key_id: str | None = Field(default=None, description="As the ask names it.")
    machines: list[str] | None = Field(default=None, description="As the ask names them.")
    code: Annotated[RejectionCode, Field(strict=False)] | None = None
    detail: Annotated[str, Field(max_length=4096)] | None = None


class ContinuationUndo(WireModel):
    """The payload of `continuation_undone`, which a worker sends to a run that took a
    continuation when the new run refused the create after all: it names it no more."""

    run_id: RunId = Field(description="The run that does not continue it.")
    proposal_id: ProposalId = Field(description="Its create, which was refused.")


class CheckpointPayload(WireModel):
    """The payload of `checkpoint`: the agent's intermediate data, replacing the run's
    checkpoint as a whole."""

    data: JsonObject


CallId = Annotated[str, Field(min_length=1, max_length=256)]


class FactPayload(WireModel):
    """The payload of an event that records a fact (e.g. `owned_run`'s `tool_result`)."""

    fact: Annotated[str, Field(min_length=1, max_length=1024)]
    call_id: CallId | None = Field(
        default=None, description="The tool call that observed it, kept with the fact."
    )


class ApprovalPayload(WireModel):
    """The payload of an approver's decision: the pause it answers and until when it
    holds. Refused unless `pause` is the revision at which the run entered the pause it
    is in, and the proposal's broker time is before `expires_at_ms`."""

    pause: int = Field(ge=0, description="The revision that entered the pause answered.")
    expires_at_ms: int = Field(ge=0, description="The decision holds until then (broker time).")


class FactSource(WireModel):
    """Where a fact came from: who recorded it, at which revision, from which tool call."""

    principal: Principal
    revision: int
    call_id: str | None = None


class Pause(WireModel):
    """The approval wait a run is in: the revision that entered it and who asked. Only
    an approver's decision naming this revision, from another principal, answers it."""

    revision: int
    asked_by: Principal
    at_ms: int


class StepStartedPayload(WireModel):
    step: Name
    idempotency_key: Annotated[str, Field(min_length=1, max_length=256)]
    call_id: CallId | None = Field(default=None, description="The tool call that runs it.")


class StepSucceededPayload(WireModel):
    step: Name
    result: JsonValue = None
    call_id: CallId | None = None


class StepFailedPayload(WireModel):
    step: Name
    error: Annotated[str, Field(min_length=1, max_length=4096)]
    call_id: CallId | None = None


class StepStatus(StrEnum):
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class StepRecord(WireModel):
    """One entry of the step ledger. `executing` after a crash means: outcome unknown."""

    status: StepStatus
    idempotency_key: str | None = None
    attempts: int = 0
    result: JsonValue = None
    error: str | None = None
    revision: int = Field(description="The run revision that last changed this step.")
    call_id: str | None = Field(default=None, description="The tool call of its latest event.")


class Timer(WireModel):
    """Something the processor will do for a run at `due_at_ms` unless the run moves on:
    propose `event` (a deadline) or publish an alert. Armed by the engine at each commit."""

    kind: Literal["deadline", "alert"]
    name: str = Field(description="approval, heartbeat, retry, or the alert rule.")
    due_at_ms: int
    event: str | None = None
    reason: str | None = None
    revision: int = Field(description="The run revision that armed it.")


class RunSnapshot(VersionedMessage):
    """A run as it stands after its latest transition: what recovery reads back."""

    run_id: RunId
    machine: Name
    machine_version: str | None = Field(
        default=None,
        description="The version of the machine the run is decided by (None: created "
        "before runs were pinned; the machine's version at hand decides it).",
    )
    state: str
    revision: int = Field(ge=0)
    retry_count: int = 0
    max_retries: int = 0
    success_criteria: list[str] = Field(default_factory=list)
    deadlines: Deadlines = Field(default_factory=Deadlines)
    facts: list[str] = Field(default_factory=list)
    steps: dict[str, StepRecord] = Field(default_factory=dict)
    checkpoint: JsonObject = Field(
        default_factory=dict,
        description="The agent's intermediate data, as its latest `checkpoint` event (or "
        "the continued run) left it; bounded by the engine's CHECKPOINT_MAX_BYTES.",
    )
    continues: RunLink | None = Field(
        default=None, description="The finished run this one continues, if any."
    )
    recent_proposals: dict[str, int] = Field(
        default_factory=dict,
        description="Committed proposal id -> its revision, the latest few, oldest first; "
        "the store remembers every one for the run's life.",
    )
    heartbeat_at_ms: int | None = Field(
        default=None,
        description="Broker time of the run's latest heartbeat since its latest transition "
        "(None: none since); the heartbeat deadline counts from it.",
    )
    stop_reason: str | None = None
    last_reason: str | None = None
    timers: list[Timer] = Field(default_factory=list)
    last_hash: str = Field(default="", description="`hash` of the run's latest transition.")
    created_at_ms: int
    updated_at_ms: int
    entered_state_at_ms: int
    pause: Pause | None = Field(
        default=None, description="The approval wait the run is in, if it is in one."
    )
    fact_sources: dict[str, FactSource] = Field(
        default_factory=dict, description="Each recorded fact's provenance."
    )
    heartbeat_id: str | None = Field(
        default=None, description="Proposal id of the latest heartbeat taken."
    )
    heartbeat_signed_at_ms: int | None = Field(
        default=None,
        description="When the latest heartbeat taken was signed: a later one must be "
        "signed after it (a replayed heartbeat moves no deadline).",
    )
    finished_by: Principal | None = Field(
        default=None, description="Who sent the transition that finished the run."
    )
    continued_by: RunId | None = Field(
        default=None,
        description="The run that continues this finished one, once it took the "
        "continuation (a run is continued once).",
    )


class Transition(VersionedMessage):
    """A committed fact: one per revision, append-only, keyed by run_id."""

    transition_id: str = Field(description="'<run_id>:<revision>', unique for the run's life.")
    run_id: RunId
    machine: Name
    machine_version: str | None = Field(
        default=None, description="The version of the machine that decided it."
    )
    revision: int = Field(ge=0)
    from_state: str | None = Field(description="None for the create transition.")
    to_state: str
    event: str
    proposal_id: ProposalId
    principal: Principal
    reason: str | None = None
    payload: JsonObject = Field(default_factory=dict)
    metadata: JsonObject = Field(default_factory=dict)
    retry_count: int = 0
    at_ms: int = Field(description="Broker timestamp of the proposal, ms since the epoch.")
    prev_hash: str = Field(default="", description="`hash` of the run's previous transition.")
    hash: str = Field(default="", description="schemas.audit.transition_hash of this record.")
    heartbeat_at_ms: int | None = Field(
        default=None,
        description="The run's latest heartbeat when this was decided, if one came after "
        "the previous transition: the time checks depend on it, so a replay needs it.",
    )


class Heartbeat(VersionedMessage):
    """The answer to a heartbeat: the run is alive, its heartbeat deadline pushed back.
    Not a transition: the revision, the transitions topic and the dedupe memory stay as
    they were. Published on the heartbeats topic, keyed by run_id."""

    run_id: RunId
    proposal_id: ProposalId
    machine: Name
    state: str
    revision: int = Field(description="The run's revision, unchanged by the heartbeat.")
    principal: Principal
    at_ms: int = Field(description="Broker timestamp of the heartbeat, ms since the epoch.")
    deadline_ms: int | None = Field(
        description="When the run's heartbeat deadline now falls due (None: no heartbeat "
        "timeout in this state)."
    )
    signed_at_ms: int | None = Field(
        default=None, description="When the heartbeat was signed; a later one must be signed after."
    )


class Alert(VersionedMessage):
    """A run has been too long in a state (or flaps between retries): an alert rule fired."""

    run_id: RunId
    machine: Name
    rule: str
    state: str
    revision: int
    retry_count: int
    time_in_state_ms: int
    due_at_ms: int
    at_ms: int = Field(description="Worker clock when the alert was raised.")


class Rejection(VersionedMessage):
    """A refused proposal, with a typed code and a detail a person can act on."""

    code: RejectionCode
    detail: str
    run_id: str | None = None
    proposal_id: str | None = None
    event: str | None = None
    principal: Principal | None = None
    state: str | None = Field(default=None, description="The run's state when refused.")
    revision: int | None = Field(default=None, description="The run's revision when refused.")
    original_transition_id: str | None = Field(
        default=None, description="For 'duplicate': the transition the first copy committed."
    )
    step_result: JsonValue = Field(
        default=None, description="For 'duplicate_step': the stored result of the step."
    )
    content_digest: str | None = Field(
        default=None,
        description="Set when the run remembers this answer for its life: the digest of "
        "the proposal's content (schemas.audit.proposal_digest). The same proposal id "
        "gets this rejection again with the same content, `proposal_id_reused` with any "
        "other.",
    )
    at_ms: int


class DeadLetter(VersionedMessage):
    """A record that is not a proposal at all, or whose outcome the broker refused, set
    aside with the reason; the partition keeps flowing. The original bytes are kept
    (base64) for inspection and replay: all of them, or, when the DLQ record would be
    larger than its topic accepts, a prefix (`truncated`), with the full length and
    SHA-256 of each either way."""

    error: str
    topic: str
    partition: int
    offset: int
    key_base64: str | None = None
    value_base64: str | None = None
    key_length: int | None = Field(default=None, description="Bytes in the original key.")
    key_sha256: str | None = Field(default=None, description="Hex SHA-256 of the original key.")
    value_length: int | None = Field(default=None, description="Bytes in the original value.")
    value_sha256: str | None = Field(default=None, description="Hex SHA-256 of the original value.")
    truncated: bool = Field(
        default=False, description="key_base64/value_base64 hold only a prefix of the bytes."
    )
    at_ms: int
