"""A linted machine compiled for fast lookups by `decide`."""

import fnmatch
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import rfc8785
from pydantic import BaseModel

from processor.engine.lint import CHECKPOINT_EVENT, HEARTBEAT_EVENT, LintIssue, lint
from processor.engine.steps import STEP_PAYLOADS
from schemas.machine import (
    EventSpec,
    Guard,
    MachineSpec,
    RetryPolicy,
    TimeoutSpec,
    TransitionSpec,
)
from schemas.messages import ApprovalPayload, CheckpointPayload, FactPayload


class MachineInvalid(ValueError):
    """A machine spec failed lint; `issues` say where and what."""

    def __init__(self, name: str, issues: list[LintIssue]) -> None:
        self.name = name
        self.issues = issues
        lines = "\n".join(f"  - {issue}" for issue in issues)
        super().__init__(f"machine '{name}' is invalid:\n{lines}")


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    event: str
    target: str
    reasons: frozenset[str]
    guards: tuple[Guard, ...]
    stop_reason: str | None


@dataclass(frozen=True, slots=True)
class EventRule:
    """Who may send an event and how its payload is typed, resolved once per machine."""

    authorities: frozenset[str]
    sources: tuple[str, ...]
    payload_model: type[BaseModel] | None
    is_step: bool
    is_heartbeat: bool = False
    is_checkpoint: bool = False
    #: The `sources` patterns as one compiled regex (fnmatch per call was a hot spot).
    source_pattern: re.Pattern[str] | None = None

    def allows(self, source: str, authority: str) -> bool:
        if authority not in self.authorities:
            return False
        return self.source_pattern is None or self.source_pattern.match(source) is not None


@dataclass(frozen=True, slots=True)
class Machine:
    spec: MachineSpec
    edges: Mapping[tuple[str, str], Edge]
    terminal: frozenset[str]
    step_states: frozenset[str]
    step_authorities: frozenset[str]
    create_authorities: frozenset[str]
    #: States from which the retry policy's event leaves (where backoff timers run).
    retry_states: frozenset[str]
    events: Mapping[str, EventSpec] = field(repr=False)
    rules: Mapping[str, EventRule] = field(repr=False)
    #: The digest of the spec's content (`version_of`): what a run is pinned to.
    version: str = ""
    #: States in which a commit arms no timer unless the run sets its own approval or
    #: heartbeat timeout (no retry or alert there, no timeout with a default duration;
    #: finished with no retention): `decide` skips `arm_timers` for such runs there,
    #: which most commits are.
    quiet_states: frozenset[str] = frozenset()
    #: `spec.dedupe_window` and `spec.retry`, read at every commit: an attribute of a
    #: pydantic model costs several times one of this slotted dataclass.
    dedupe_window: int = 0
    retry: RetryPolicy | None = None
    #: Approval waits: states an approver's decision (an `approval` event) leaves. A
    #: commit entering one records the pause (its revision, who asked).
    approval_states: frozenset[str] = frozenset()
    #: Who decides approvals (the authorities of its `approval` events): a run one of
    #: them finished is not carried on by another run.
    approval_authorities: frozenset[str] = frozenset()
    #: The deadlines (`timeouts`) by the edge they propose, (state, event): a proposal
    #: on one of those edges is checked against them (`decide._unripe_deadline`); the
    #: rest, most proposals, cost a dict lookup.
    deadline_edges: Mapping[tuple[str, str], tuple[TimeoutSpec, ...]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name


def version_of(spec: MachineSpec) -> str:
    """A machine version: the first 16 hex digits of the SHA-256 of the spec as RFC 8785
    canonical JSON, as the transitions are hashed, so that a tool in another language
    computes it too. Any change to what the machine decides makes a new version."""
    canonical = rfc8785.dumps(_versioned_content(spec))
    return hashlib.sha256(canonical).hexdigest()[:16]


#: Fields machine specs gained after versions were first published, each with the value
#: that means what a spec without it meant: left out of the digest at that value, so
#: that every version published before keeps its digest (and its runs their machine).
_LATER_FIELDS: dict[str, object] = {"concurrent_steps": None, "ceilings": None}
_LATER_EVENT_FIELDS = {"approval": None}
_LATER_TIMEOUT_FIELDS = {"remind_before_ms": None, "grace_ms": None}


def _versioned_content(spec: MachineSpec) -> dict[str, Any]:
    content = spec.model_dump(mode="json", by_alias=True)
    for name, default in _LATER_FIELDS.items():
        if content.get(name) == default:
            del content[name]
    for event in content["events"].values():
        for name, default in _LATER_EVENT_FIELDS.items():
            if event.get(name) == default:
                del event[name]
    for timeout in content["timeouts"]:
        for name, default in _LATER_TIMEOUT_FIELDS.items():
            if timeout.get(name) == default:
                del timeout[name]
    return content


class Catalog(dict[str, Machine]):
    """The machines new runs get, by name, and every other version known, so that each
    run is decided by the version it is pinned to."""

    def __init__(self, current: Iterable[Machine] = (), older: Iterable[Machine] = ()) -> None:
        super().__init__((m.name, m) for m in current)
        self.versions: dict[tuple[str, str], Machine] = {}
        for machine in (*older, *self.values()):
            self.versions[(machine.name, machine.version)] = machine

    def add_version(self, machine: Machine) -> None:
        self.versions[(machine.name, machine.version)] = machine


def with_current(
    machines: Mapping[str, Machine], name: str, version: str | None
) -> Mapping[str, Machine]:
    """`machines` with version `version` of `name` as the one new runs get, when it is
    held: how a run's creation is decided again (replay, verify) by the version it got."""
    machine = machine_for(machines, name, version)
    if machine is None or machines.get(name) is machine:
        return machines
    pinned = Catalog(
        machines.values(), machines.versions.values() if isinstance(machines, Catalog) else ()
    )
    pinned[name] = machine
    return pinned


def machine_for(machines: Mapping[str, Machine], name: str, version: str | None) -> Machine | None:
    """The machine that decides a run of `name` pinned to `version` (None: a run from
    before versions, decided by the machine at hand), or None when it is not held."""
    current = machines.get(name)
    if version is None or (current is not None and current.version == version):
        return current
    if isinstance(machines, Catalog):
        return machines.versions.get((name, version))
    return None


def is_finished(
    machines: Mapping[str, Machine], machine: str, version: str | None, state: str
) -> bool:
    """Whether a run of `machine` (pinned to `version`) in `state` has finished: the state
    is terminal in the machine that decides it. False when that machine is not held."""
    decides = machine_for(machines, machine, version)
    return decides is not None and state in decides.terminal


def _edge(t: TransitionSpec) -> Edge:
    return Edge(t.source, t.event, t.target, frozenset(t.reasons), tuple(t.guards), t.stop_reason)


def _sources_pattern(patterns: list[str]) -> re.Pattern[str] | None:
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def compile_machine(spec: MachineSpec) -> Machine:
    """Lint `spec` and build its lookup tables; raises MachineInvalid on any issue."""
    issues = lint(spec)
    if issues:
        raise MachineInvalid(spec.name, issues)
    rules = {
        name: EventRule(
            frozenset(event.authorities),
            tuple(event.sources),
            _payload_model(event),
            is_step=False,
            source_pattern=_sources_pattern(event.sources),
        )
        for name, event in spec.events.items()
    }
    step_authorities = frozenset(spec.step_authorities)
    for name, model in STEP_PAYLOADS.items():
        rules[name] = EventRule(step_authorities, (), model, is_step=True)
    rules[HEARTBEAT_EVENT] = EventRule(step_authorities, (), None, is_step=False, is_heartbeat=True)
    # The checkpoint is the step ledger's companion (the work's intermediate data), so
    # whoever may record steps may record it: no authority list of its own, which would
    # also have changed every machine's version.
    rules[CHECKPOINT_EVENT] = EventRule(
        step_authorities, (), CheckpointPayload, is_step=False, is_checkpoint=True
    )
    retry_event = spec.retry.event if spec.retry is not None else None
    retry_states = frozenset(t.source for t in spec.transitions if t.event == retry_event)
    return Machine(
        spec=spec,
        edges={(t.source, t.event): _edge(t) for t in spec.transitions},
        terminal=frozenset(spec.terminal),
        step_states=frozenset(spec.step_states),
        step_authorities=step_authorities,
        create_authorities=frozenset(spec.create_authorities),
        retry_states=retry_states,
        events=dict(spec.events),
        rules=rules,
        version=version_of(spec),
        quiet_states=_quiet_states(spec, retry_states),
        dedupe_window=spec.dedupe_window,
        retry=spec.retry,
        approval_states=approval_states(spec),
        approval_authorities=frozenset(
            a for e in spec.events.values() if e.approval is not None for a in e.authorities
        ),
        deadline_edges=_deadline_edges(spec),
    )


def _deadline_edges(spec: MachineSpec) -> dict[tuple[str, str], tuple[TimeoutSpec, ...]]:
    edges: dict[tuple[str, str], tuple[TimeoutSpec, ...]] = {}
    for timeout in spec.timeouts:
        key = (timeout.state, timeout.event)
        edges[key] = (*edges.get(key, ()), timeout)
    return edges


def _payload_model(event: EventSpec) -> type[BaseModel] | None:
    if event.records_fact:
        return FactPayload
    return ApprovalPayload if event.approval is not None else None


def approval_states(spec: MachineSpec) -> frozenset[str]:
    """The states an approver's decision leaves: where runs wait for one."""
    return frozenset(
        t.source
        for t in spec.transitions
        if t.event in spec.events and spec.events[t.event].approval is not None
    )


def _quiet_states(spec: MachineSpec, retry_states: frozenset[str]) -> frozenset[str]:
    """The states where `arm_timers` returns no timer for a run without approval or
    heartbeat timeouts of its own (see its branches)."""
    terminal = set(spec.terminal)
    timed = {t.state for t in spec.timeouts if t.after_ms is not None}
    timed |= {a.state for a in spec.alerts}
    if spec.retry is not None:
        timed |= retry_states
    return frozenset(
        state
        for state in spec.states
        if (spec.retention_ms is None if state in terminal else state not in timed)
    )
