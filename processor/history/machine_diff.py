"""What changed between two versions of a machine, and which changes break runs in flight.

A change is *breaking* when a run created under the old version and decided under the
new one could get stuck or be decided differently: a state, event or transition it
relies on gone or moved, someone who could send an event no longer allowed, a guard or
a required reason it did not have to meet, a deadline or retry schedule it was promised
changed, a terminal state that is no longer one. Additions and widenings are
*compatible*. Pure: two `MachineSpec`s in, a list of `Change`s out (`runstate machines
diff` prints them).
"""

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from schemas.machine import EventSpec, Guard, MachineSpec, RetryPolicy, TimeoutSpec

BREAKING = "breaking"
COMPATIBLE = "compatible"


@dataclass(frozen=True)
class Change:
    """One difference: its `impact` (breaking or compatible), a stable `kind` for
    scripts, what it is about (`subject`: a state, an event, an edge) and one line for
    people."""

    impact: str
    kind: str
    subject: str
    description: str

    @property
    def breaking(self) -> bool:
        return self.impact == BREAKING

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "breaking": self.breaking}


def diff(old: MachineSpec, new: MachineSpec) -> list[Change]:
    """Every difference between `old` and `new`, breaking ones first, each once."""
    changes = [
        *_identity(old, new),
        *_states(old, new),
        *_events(old, new),
        *_transitions(old, new),
        *_retry(old.retry, new.retry),
        *_timeouts(old, new),
        *_alerts(old, new),
        *_the_rest(old, new),
    ]
    return sorted(changes, key=lambda c: c.impact != BREAKING)


def _breaking(kind: str, subject: str, description: str) -> Change:
    return Change(BREAKING, kind, subject, description)


def _compatible(kind: str, subject: str, description: str) -> Change:
    return Change(COMPATIBLE, kind, subject, description)


def _names(items: Iterable[str]) -> str:
    return ", ".join(sorted(items))


# Fields compared by a function of their own below; any other field of MachineSpec
# (one this module predates) is compared by `_the_rest`.
_HANDLED = {
    "schema_version",
    "name",
    "description",
    "label",
    "states",
    "initial",
    "terminal",
    "events",
    "transitions",
    "retry",
    "step_states",
    "default_success_criteria",
    "dedupe_window",
    "timeouts",
    "alerts",
}


def _identity(old: MachineSpec, new: MachineSpec) -> Iterator[Change]:
    if old.name != new.name:
        yield _breaking(
            "name_changed",
            "machine",
            f"machine name changed from {old.name} to {new.name}: runs name their machine, "
            "so these are two machines, not two versions of one",
        )
    if old.description != new.description:
        yield _compatible("description_changed", "machine", "description changed")
    old_label, new_label = getattr(old, "label", None), getattr(new, "label", None)
    if old_label != new_label:
        yield _compatible(
            "label_changed", "machine", f"label changed from {old_label!r} to {new_label!r}"
        )


def _states(old: MachineSpec, new: MachineSpec) -> Iterator[Change]:
    old_states, new_states = set(old.states), set(new.states)
    for state in sorted(old_states - new_states):
        yield _breaking(
            "state_removed",
            f"state {state}",
            f"state {state} removed: runs in it could not move again",
        )
    for state in sorted(new_states - old_states):
        terminal = " (terminal)" if state in new.terminal else ""
        yield _compatible("state_added", f"state {state}", f"state {state} added{terminal}")
    if old.initial != new.initial:
        yield _breaking(
            "initial_changed",
            f"state {new.initial}",
            f"initial state changed from {old.initial} to {new.initial}: a create is "
            "decided differently",
        )
    # A state removed or added holds no run that its being terminal or accepting
    # steps could change: only states in both versions are compared below.
    both = old_states & new_states
    old_terminal, new_terminal = set(old.terminal) & both, set(new.terminal) & both
    for state in sorted(new_terminal - old_terminal):
        yield _breaking(
            "terminal_added",
            f"state {state}",
            f"state {state} is now terminal: runs in it are finished and refuse every event",
        )
    for state in sorted(old_terminal - new_terminal):
        yield _breaking(
            "terminal_removed",
            f"state {state}",
            f"state {state} is no longer terminal: finished runs in it could be moved again",
        )
    old_steps, new_steps = set(old.step_states) & both, set(new.step_states) & both
    for state in sorted(old_steps - new_steps):
        yield _breaking(
            "step_state_removed",
            f"state {state}",
            f"steps and heartbeats no longer accepted in {state}: a run in it mid-step "
            "could not record the step's outcome",
        )
    for state in sorted(new_steps - old_steps):
        yield _compatible(
            "step_state_added", f"state {state}", f"steps and heartbeats now accepted in {state}"
        )


def _widened_or_narrowed(
    kind: str, subject: str, what: str, old: Iterable[str], new: Iterable[str]
) -> Iterator[Change]:
    """A list of who may do something: losing a member breaks, gaining one does not."""
    old_set, new_set = set(old), set(new)
    if old_set - new_set:
        yield _breaking(
            f"{kind}_narrowed",
            subject,
            f"{what} no longer include {_names(old_set - new_set)}",
        )
    if new_set - old_set:
        yield _compatible(
            f"{kind}_widened", subject, f"{what} now include {_names(new_set - old_set)}"
        )


def _events(old: MachineSpec, new: MachineSpec) -> Iterator[Change]:
    for name in sorted(old.events.keys() - new.events.keys()):
        yield _breaking(
            "event_removed",
            f"event {name}",
            f"event {name} removed: it is refused unknown_event",
        )
    for name in sorted(new.events.keys() - old.events.keys()):
        yield _compatible("event_added", f"event {name}", f"event {name} added")
    for name in sorted(old.events.keys() & new.events.keys()):
        yield from _event(name, old.events[name], new.events[name])


def _event(name: str, old: EventSpec, new: EventSpec) -> Iterator[Change]:
    subject = f"event {name}"
    yield from _widened_or_narrowed(
        "authorities", subject, f"{name}'s authorities", old.authorities, new.authorities
    )
    # No patterns means any source; patterns are compared as written (one that another
    # covers is still counted as removed: the diff does not reason about fnmatch).
    if not old.sources and new.sources:
        yield _breaking(
            "sources_narrowed",
            subject,
            f"{name} now only from sources {_names(new.sources)} (was any source)",
        )
    elif old.sources and not new.sources:
        yield _compatible("sources_widened", subject, f"{name} now from any source")
    elif old.sources:
        yield from _widened_or_narrowed(
            "sources", subject, f"{name}'s sources", old.sources, new.sources
        )
    if old.records_fact != new.records_fact:
        now = "records" if new.records_fact else "no longer records"
        yield _breaking(
            "records_fact_changed",
            subject,
            f"{name} {now} its payload's fact: its payload and the run's facts differ",
        )
    if old.description != new.description:
        yield _compatible("event_description_changed", subject, f"{name}'s description changed")


def _edge_name(source: str, event: str) -> str:
    return f"{source} --{event}-->"


def _transitions(old: MachineSpec, new: MachineSpec) -> Iterator[Change]:
    old_edges = {(t.source, t.event): t for t in old.transitions}
    new_edges = {(t.source, t.event): t for t in new.transitions}
    for key in sorted(old_edges.keys() - new_edges.keys()):
        gone = old_edges[key]
        yield _breaking(
            "transition_removed",
            f"transition {_edge_name(*key)}",
            f"transition {_edge_name(*key)} {gone.target} removed: {key[1]} in {key[0]} "
            "is refused invalid_transition",
        )
    for key in sorted(new_edges.keys() - old_edges.keys()):
        added = new_edges[key]
        yield _compatible(
            "transition_added",
            f"transition {_edge_name(*key)}",
            f"transition {_edge_name(*key)} {added.target} added",
        )
    for key in sorted(old_edges.keys() & new_edges.keys()):
        was, now = old_edges[key], new_edges[key]
        subject = f"transition {_edge_name(*key)}"
        edge = _edge_name(*key)
        if was.target != now.target:
            yield _breaking(
                "transition_retargeted",
                subject,
                f"{edge} now leads to {now.target} (was {was.target})",
            )
        yield from _reasons(subject, edge, was.reasons, now.reasons)
        yield from _guards(subject, edge, was.guards, now.guards)
        if was.stop_reason != now.stop_reason:
            yield _breaking(
                "stop_reason_changed",
                subject,
                f"{edge} records stop reason {now.stop_reason!r} (was {was.stop_reason!r})",
            )


def _reasons(subject: str, edge: str, old: list[str], new: list[str]) -> Iterator[Change]:
    # No reasons listed: none required. A list: one of them required.
    if not old and new:
        yield _breaking(
            "reasons_required",
            subject,
            f"{edge} now requires a reason ({_names(new)}); none was required",
        )
    elif old and not new:
        yield _compatible("reasons_dropped", subject, f"{edge} no longer requires a reason")
    elif old:
        yield from _widened_or_narrowed("reasons", subject, f"{edge}'s reasons", old, new)


def _guard_facts(guards: Iterable[Guard]) -> dict[str, set[str]]:
    by_kind: dict[str, set[str]] = {}
    for guard in guards:
        by_kind.setdefault(guard.kind.value, set()).update(guard.facts)
    return by_kind


def _guards(subject: str, edge: str, old: list[Guard], new: list[Guard]) -> Iterator[Change]:
    was, now = _guard_facts(old), _guard_facts(new)
    for kind in sorted(now.keys() - was.keys()):
        yield _breaking("guard_added", subject, f"{edge} gains guard {kind}")
    for kind in sorted(was.keys() - now.keys()):
        yield _compatible("guard_removed", subject, f"{edge} loses guard {kind}")
    for kind in sorted(was.keys() & now.keys()):
        if now[kind] - was[kind]:
            yield _breaking(
                "guard_tightened",
                subject,
                f"{edge}'s guard {kind} now also needs {_names(now[kind] - was[kind])}",
            )
        if was[kind] - now[kind]:
            yield _compatible(
                "guard_loosened",
                subject,
                f"{edge}'s guard {kind} no longer needs {_names(was[kind] - now[kind])}",
            )


def _retry(old: RetryPolicy | None, new: RetryPolicy | None) -> Iterator[Change]:
    if old is None and new is None:
        return
    if old is None or new is None:
        yield _breaking(
            "retry_policy_added" if old is None else "retry_policy_removed",
            "retry",
            "retry policy added: retries now spend a budget"
            if old is None
            else "retry policy removed: retries no longer spend a budget",
        )
        return
    for field in type(old).model_fields:
        was, now = getattr(old, field), getattr(new, field)
        if was != now:
            yield _breaking(
                "retry_policy_changed",
                "retry",
                f"retry {field} changed from {was} to {now}: runs retrying now are "
                "scheduled or budgeted differently",
            )


def _timeout_key(timeout: TimeoutSpec) -> tuple[str, str]:
    return timeout.kind, timeout.state


def _timeouts(old: MachineSpec, new: MachineSpec) -> Iterator[Change]:
    was = {_timeout_key(t): t for t in old.timeouts}
    now = {_timeout_key(t): t for t in new.timeouts}
    for kind, state in sorted(was.keys() - now.keys()):
        yield _breaking(
            "timeout_removed",
            f"state {state}",
            f"{kind} timeout of {state} removed: runs waiting there are no longer timed out",
        )
    for kind, state in sorted(now.keys() - was.keys()):
        yield _compatible("timeout_added", f"state {state}", f"{kind} timeout of {state} added")
    for key in sorted(was.keys() & now.keys()):
        before, after = was[key], now[key]
        for field in type(before).model_fields:
            if getattr(before, field) != getattr(after, field):
                yield _breaking(
                    "timeout_changed",
                    f"state {key[1]}",
                    f"{key[0]} timeout of {key[1]}: {field} changed from "
                    f"{getattr(before, field)} to {getattr(after, field)}",
                )


def _alerts(old: MachineSpec, new: MachineSpec) -> Iterator[Change]:
    # Alerts are records for people; they decide nothing, so no change to one breaks.
    was = {a.rule: a for a in old.alerts}
    now = {a.rule: a for a in new.alerts}
    for rule in sorted(was.keys() - now.keys()):
        yield _compatible("alert_removed", f"alert {rule}", f"alert {rule} removed")
    for rule in sorted(now.keys() - was.keys()):
        yield _compatible("alert_added", f"alert {rule}", f"alert {rule} added")
    for rule in sorted(was.keys() & now.keys()):
        if was[rule] != now[rule]:
            yield _compatible("alert_changed", f"alert {rule}", f"alert {rule} changed")


def _the_rest(old: MachineSpec, new: MachineSpec) -> Iterator[Change]:
    if old.dedupe_window > new.dedupe_window:
        yield _breaking(
            "dedupe_window_shrunk",
            "dedupe_window",
            f"dedupe window shrunk from {old.dedupe_window} to {new.dedupe_window}: a "
            "resent proposal id could be committed again",
        )
    elif old.dedupe_window < new.dedupe_window:
        yield _compatible(
            "dedupe_window_grown",
            "dedupe_window",
            f"dedupe window grown from {old.dedupe_window} to {new.dedupe_window}",
        )
    if old.default_success_criteria != new.default_success_criteria:
        yield _compatible(
            "default_success_criteria_changed",
            "default_success_criteria",
            "default success criteria changed (a run keeps the criteria it was created "
            "with; new runs get "
            f"{_names(new.default_success_criteria) or 'none'})",
        )
    for field in sorted(type(new).model_fields.keys() | type(old).model_fields.keys()):
        if field in _HANDLED:
            continue
        was, now = getattr(old, field, None), getattr(new, field, None)
        if was == now:
            continue
        if field.endswith("_authorities") and isinstance(was, list) and isinstance(now, list):
            # create_authorities, step_authorities and any like them
            yield from _widened_or_narrowed(field, field, field, was, now)
        else:
            yield _breaking(
                f"{field}_changed",
                field,
                f"{field} changed from {was!r} to {now!r} (not classified: review it)",
            )
