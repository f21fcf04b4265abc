"""A machine as data: states, events, who may send them, and the transition table."""

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from schemas.base import VersionedMessage, WireModel
from schemas.identifiers import Name
from schemas.ijson import MAX_EXACT_INTEGER


class GuardKind(StrEnum):
    #: Every success criterion of the run is among its recorded facts.
    SUCCESS_CRITERIA = "success_criteria"
    #: The listed facts are all recorded.
    FACTS_PRESENT = "facts_present"
    #: The retry budget is spent: retry_count has reached max_retries (so that, e.g.,
    #: `max_retries_exceeded` fails a run only once no retry is left).
    RETRIES_EXHAUSTED = "retries_exhausted"
    #: No step of the run is executing: every step it started succeeded or failed (a
    #: run does not reach success with a side effect whose outcome is unknown).
    STEPS_SETTLED = "steps_settled"


class Guard(WireModel):
    kind: GuardKind
    facts: list[str] = Field(default_factory=list)


class EventSpec(WireModel):
    """Who may send an event, and what it records."""

    authorities: list[str] = Field(description="Authorities allowed to send it.")
    sources: list[str] = Field(
        default_factory=list,
        description="If set, the principal's source must match one (fnmatch pattern).",
    )
    records_fact: bool = Field(
        default=False, description="The payload's `fact` is added to the run's facts."
    )
    approval: Literal["grant", "deny"] | None = Field(
        default=None,
        description="An approver's decision on the run's pause: its payload names the "
        "pause (the revision that entered it) and the decision's expiry; refused when it "
        "answers another pause, has expired, or comes from the principal that asked.",
    )
    description: str = ""


class TransitionSpec(WireModel):
    source: Name = Field(alias="from")
    event: Name
    target: Name = Field(alias="to")
    reasons: list[str] = Field(
        default_factory=list, description="If set, a reason is required and must be one of these."
    )
    guards: list[Guard] = Field(default_factory=list)
    stop_reason: str | None = Field(
        default=None, description="Recorded when this edge ends the run; else the reason/event."
    )


class RetryPolicy(WireModel):
    """The retry budget: `retry` spends it; past it, only `exhausted_event` may follow."""

    event: Name = "retry"
    exhausted_event: Name | None = "max_retries_exceeded"
    default_max_retries: Annotated[int, Field(ge=0, le=MAX_EXACT_INTEGER)] = 3
    backoff_base_ms: Annotated[int, Field(gt=0, le=MAX_EXACT_INTEGER)] | None = Field(
        default=1_000,
        description="The processor proposes `event` after base * 2^retry_count ms (capped, "
        "jittered) in the retry event's source state; None: agents retry on their own.",
    )
    backoff_max_ms: Annotated[int, Field(gt=0, le=MAX_EXACT_INTEGER)] = 300_000
    jitter: Annotated[float, Field(ge=0, le=1)] = 0.2


class Ceilings(WireModel):
    """The operator's upper bounds on what a run's creator chooses: a `create` over one
    is refused `limit_exceeded`."""

    max_retries: Annotated[int, Field(ge=0, le=MAX_EXACT_INTEGER)] = 100
    #: For approval_timeout_ms, heartbeat_timeout_ms and retry_backoff_ms alike.
    max_timeout_ms: Annotated[int, Field(gt=0, le=MAX_EXACT_INTEGER)] = 30 * 24 * 3_600_000
    max_success_criteria: Annotated[int, Field(ge=0, le=10_000)] = 64


class TimeoutSpec(WireModel):
    """A deadline the processor keeps: after `after_ms` in `state` it proposes `event`.

    `approval` counts from entering the state; `heartbeat` from the run's latest
    transition or heartbeat, whichever came last. A run's options override `after_ms`
    (approval_timeout_ms, heartbeat_timeout_ms); None arms it only for runs that set one.
    """

    kind: Literal["approval", "heartbeat"]
    state: Name
    event: Name
    reason: str | None = None
    after_ms: Annotated[int, Field(gt=0, le=MAX_EXACT_INTEGER)] | None = None
    remind_before_ms: Annotated[int, Field(gt=0, le=MAX_EXACT_INTEGER)] | None = Field(
        default=None,
        description="An approval deadline's reminder: an alert (rule `approval_reminder`) "
        "this long before it falls due.",
    )
    grace_ms: Annotated[int, Field(gt=0, le=MAX_EXACT_INTEGER)] | None = Field(
        default=None,
        description="After an approval deadline ended the run, a decision arriving within "
        "this long is told so: the run is continued from its checkpoint by a new one.",
    )


class AlertSpec(WireModel):
    """An alert record when a run stays `after_ms` in `state` (and, for
    flapping, has retried at least `min_retry_count` times)."""

    rule: Name
    state: Name
    after_ms: Annotated[int, Field(ge=0, le=MAX_EXACT_INTEGER)]
    min_retry_count: Annotated[int, Field(ge=0, le=MAX_EXACT_INTEGER)] | None = None


class MachineSpec(VersionedMessage):
    """A machine. Its version is the digest of its content (engine.machine.version_of):
    a run is decided all its life by the version that created it, until migrated.
    Its integers are within ±(2**53-1), which every JSON reader keeps exactly (I-JSON)."""

    name: Name
    label: str | None = Field(
        default=None, description="A human name for this version (e.g. '2026-12 leads approve')."
    )
    description: str = ""
    states: list[Name]
    initial: Name
    terminal: list[Name]
    events: dict[str, EventSpec]
    transitions: list[TransitionSpec]
    retry: RetryPolicy | None = None
    create_authorities: list[str] = Field(default_factory=lambda: ["runtime"])
    step_states: list[Name] = Field(
        default_factory=lambda: ["running"],
        description="States in which the step ledger accepts events.",
    )
    step_authorities: list[str] = Field(default_factory=lambda: ["runtime", "tool_executor"])
    default_success_criteria: list[str] = Field(default_factory=list)
    dedupe_window: Annotated[int, Field(ge=1, le=10_000)] = Field(
        default=64,
        description="How many recent proposal ids a run's snapshot carries (every one is "
        "remembered for the run's life in the worker's store).",
    )
    migrate_authorities: list[str] = Field(
        default_factory=lambda: ["runtime"],
        description="Who may move a run of this machine to another version of it.",
    )
    retention_ms: Annotated[int, Field(gt=0, le=MAX_EXACT_INTEGER)] | None = Field(
        default=None,
        description="A finished run is forgotten this long after it entered its terminal "
        "state: removed from the stores, the changelog and the dedupe memory (its "
        "transitions stay in the transitions topic). None: kept for ever.",
    )
    timeouts: list[TimeoutSpec] = Field(default_factory=list)
    alerts: list[AlertSpec] = Field(default_factory=list)
    concurrent_steps: bool | None = Field(
        default=None,
        description="Whether a run may have several steps executing at once (true) or one "
        "at a time (false); either way an executing step is not started again until it is "
        "settled. Absent, as in versions written before it: neither rule (a version "
        "decides as it always did).",
    )
    ceilings: Ceilings | None = Field(
        default=None,
        description="Bounds on the limits a run's creator chooses (`{}`: the defaults). "
        "Absent, as in versions written before it: none.",
    )
