"""Static checks of a machine spec. Each issue names the spec path it is about, so a
file loader can turn it into a line number."""

from collections import deque
from dataclasses import dataclass

from schemas.machine import GuardKind, MachineSpec

#: The authority the worker's timers propose deadlines with.
TIMER_AUTHORITY = "runtime"
#: Events every machine understands without declaring them.
CREATE_EVENT = "create"
HEARTBEAT_EVENT = "heartbeat"
MIGRATE_EVENT = "migrate"
FORGET_EVENT = "forget"
CHECKPOINT_EVENT = "checkpoint"
STEP_EVENTS = ("step_started", "step_succeeded", "step_failed")
RESERVED_EVENTS = frozenset(
    (CREATE_EVENT, HEARTBEAT_EVENT, MIGRATE_EVENT, FORGET_EVENT, CHECKPOINT_EVENT, *STEP_EVENTS)
)

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class LintIssue:
    path: Path
    message: str

    def __str__(self) -> str:
        where = ".".join(str(p) for p in self.path) or "(top)"
        return f"{where}: {self.message}"


def lint(spec: MachineSpec) -> list[LintIssue]:
    """All problems of `spec`, in file order; empty when the machine is sound."""
    issues: list[LintIssue] = []
    states = set(spec.states)
    terminal = set(spec.terminal)

    issues += _duplicates(spec.states, "states", "state")
    if spec.initial not in states:
        issues.append(LintIssue(("initial",), f"unknown state '{spec.initial}'"))
    for i, name in enumerate(spec.terminal):
        if name not in states:
            issues.append(LintIssue(("terminal", i), f"unknown state '{name}'"))
    if spec.initial in terminal:
        issues.append(LintIssue(("initial",), "the initial state must not be terminal"))

    for name, event in spec.events.items():
        if name in RESERVED_EVENTS:
            issues.append(
                LintIssue(("events", name), f"'{name}' is a built-in event and cannot be redefined")
            )
        if not event.authorities:
            issues.append(
                LintIssue(("events", name, "authorities"), "no authority may send this event")
            )

    seen: dict[tuple[str, str], int] = {}
    for i, edge in enumerate(spec.transitions):
        where: Path = ("transitions", i)
        if edge.source not in states:
            issues.append(LintIssue((*where, "from"), f"unknown state '{edge.source}'"))
        if edge.target not in states:
            issues.append(LintIssue((*where, "to"), f"unknown state '{edge.target}'"))
        if edge.event not in spec.events:
            issues.append(LintIssue((*where, "event"), f"unknown event '{edge.event}'"))
        if edge.source in terminal:
            issues.append(
                LintIssue(where, f"terminal state '{edge.source}' must have no outgoing transition")
            )
        key = (edge.source, edge.event)
        if key in seen:
            issues.append(
                LintIssue(
                    where,
                    f"duplicate transition ({edge.source}, {edge.event}); "
                    f"first defined at transitions.{seen[key]}",
                )
            )
        else:
            seen[key] = i
        for g, guard in enumerate(edge.guards):
            if guard.kind is GuardKind.RETRIES_EXHAUSTED and spec.retry is None:
                issues.append(
                    LintIssue((*where, "guards", g), "retries_exhausted guard needs a retry policy")
                )
            if guard.kind is GuardKind.FACTS_PRESENT and not guard.facts:
                issues.append(LintIssue((*where, "guards", g), "facts_present lists no facts"))

    if spec.retry is not None:
        if spec.retry.event not in spec.events:
            issues.append(LintIssue(("retry", "event"), f"unknown event '{spec.retry.event}'"))
        exhausted = spec.retry.exhausted_event
        if exhausted is not None and exhausted not in spec.events:
            issues.append(LintIssue(("retry", "exhausted_event"), f"unknown event '{exhausted}'"))
    for i, name in enumerate(spec.step_states):
        if name not in states:
            issues.append(LintIssue(("step_states", i), f"unknown state '{name}'"))

    edges = {(t.source, t.event): t for t in spec.transitions}
    armed: set[tuple[str, str]] = set()
    for i, timeout in enumerate(spec.timeouts):
        where = ("timeouts", i)
        if timeout.state not in states:
            issues.append(LintIssue((*where, "state"), f"unknown state '{timeout.state}'"))
            continue
        armed_edge = edges.get((timeout.state, timeout.event))
        if armed_edge is None:
            issues.append(
                LintIssue(
                    where,
                    f"{timeout.kind} deadline on '{timeout.state}' proposes '{timeout.event}', "
                    f"but there is no transition ({timeout.state}, {timeout.event})",
                )
            )
        elif armed_edge.reasons and timeout.reason not in armed_edge.reasons:
            issues.append(
                LintIssue(
                    (*where, "reason"),
                    f"({timeout.state}, {timeout.event}) needs a reason from "
                    f"{', '.join(armed_edge.reasons)}; the deadline gives {timeout.reason!r}",
                )
            )
        event_spec = spec.events.get(timeout.event)
        if event_spec is not None and TIMER_AUTHORITY not in event_spec.authorities:
            # The worker proposes the deadline with its runtime key: refused, it would
            # leave the run waiting on a timeout that can never commit.
            issues.append(
                LintIssue(
                    (*where, "event"),
                    f"the deadline proposes '{timeout.event}', which authority "
                    f"'{TIMER_AUTHORITY}' (the worker's timers) may not send",
                )
            )
        if (timeout.state, timeout.kind) in armed:
            issues.append(
                LintIssue(where, f"a second {timeout.kind} deadline on '{timeout.state}'")
            )
        armed.add((timeout.state, timeout.kind))
    for i, alert in enumerate(spec.alerts):
        if alert.state not in states:
            issues.append(LintIssue(("alerts", i, "state"), f"unknown state '{alert.state}'"))

    issues += _approval_issues(spec, terminal)
    issues += _graph_issues(spec, states, terminal)
    return issues


def _approval_issues(spec: MachineSpec, terminal: set[str]) -> list[LintIssue]:
    """An approval wait is left only by an approver's decision, or into a finished
    state (denied, timed out, cancelled); and no authority both asks and decides."""
    issues: list[LintIssue] = []
    for name, event in spec.events.items():
        if event.approval is not None and event.records_fact:
            issues.append(
                LintIssue(("events", name), "an approval decision cannot also record a fact")
            )
    waits = {
        t.source
        for t in spec.transitions
        if t.event in spec.events and spec.events[t.event].approval is not None
    }
    for i, edge in enumerate(spec.transitions):
        asked = spec.events.get(edge.event)
        if asked is None:
            continue
        if edge.source in waits and asked.approval is None and edge.target not in terminal:
            issues.append(
                LintIssue(
                    ("transitions", i),
                    f"'{edge.event}' leaves approval wait '{edge.source}' for '{edge.target}', "
                    "which is not finished: only an approver's decision (an event with "
                    "`approval`) may move a waiting run on",
                )
            )
        if edge.target in waits and edge.source != edge.target:
            deciders = {
                a
                for t in spec.transitions
                if t.source == edge.target and t.event in spec.events
                for a in (spec.events[t.event].authorities if spec.events[t.event].approval else ())
            }
            both = sorted(set(asked.authorities) & deciders)
            if both:
                issues.append(
                    LintIssue(
                        ("transitions", i),
                        f"authority {', '.join(both)} may both ask for the approval "
                        f"('{edge.event}' into '{edge.target}') and decide it: whoever asks "
                        "must not be able to approve",
                    )
                )
    return issues


def _duplicates(names: list[str], field: str, what: str) -> list[LintIssue]:
    first: dict[str, int] = {}
    issues = []
    for i, name in enumerate(names):
        if name in first:
            issues.append(LintIssue((field, i), f"duplicate {what} '{name}'"))
        first.setdefault(name, i)
    return issues


def _graph_issues(spec: MachineSpec, states: set[str], terminal: set[str]) -> list[LintIssue]:
    out_edges: dict[str, set[str]] = {s: set() for s in states}
    for edge in spec.transitions:
        if edge.source in states and edge.target in states:
            out_edges[edge.source].add(edge.target)

    reached = {spec.initial} if spec.initial in states else set()
    queue = deque(reached)
    while queue:
        for nxt in out_edges[queue.popleft()]:
            if nxt not in reached:
                reached.add(nxt)
                queue.append(nxt)

    issues = []
    for i, name in enumerate(spec.states):
        if name not in reached and spec.initial in states:
            issues.append(
                LintIssue(("states", i), f"state '{name}' is unreachable from '{spec.initial}'")
            )
        # A self-loop is not a way out: a run there could never finish.
        if name not in terminal and not (out_edges.get(name, set()) - {name}):
            issues.append(
                LintIssue(
                    ("states", i),
                    f"non-terminal state '{name}' has no way out; add a transition or mark it "
                    "terminal",
                )
            )
    return issues
