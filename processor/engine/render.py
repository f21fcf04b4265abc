"""Human views of a machine: the transition table rows and a Mermaid state diagram."""

from processor.engine.lint import CHECKPOINT_EVENT, STEP_EVENTS
from processor.engine.machine import Machine


def table_rows(machine: Machine) -> list[tuple[str, str, str, str, str]]:
    """(from, event, to, authorities, conditions) per transition, in file order."""
    rows = []
    for t in machine.spec.transitions:
        event = machine.events[t.event]
        who = ", ".join(event.authorities)
        if event.sources:
            who += f" [{', '.join(event.sources)}]"
        conditions = []
        if t.reasons:
            conditions.append("reason in {" + ", ".join(t.reasons) + "}")
        for guard in t.guards:
            facts = f"({', '.join(guard.facts)})" if guard.facts else ""
            conditions.append(f"guard {guard.kind.value}{facts}")
        if event.records_fact:
            conditions.append("records fact")
        if event.approval is not None:
            conditions.append(f"approval {event.approval}: bound to the pause, not the asker")
        retry = machine.spec.retry
        if retry is not None and t.event == retry.event:
            conditions.append("spends retry budget")
        rows.append((t.source, t.event, t.target, who, "; ".join(conditions)))
    return rows


def mermaid(machine: Machine) -> str:
    """A `stateDiagram-v2` of the machine; step events are noted on their states."""
    spec = machine.spec
    lines = ["stateDiagram-v2", f"    [*] --> {spec.initial}"]
    for t in spec.transitions:
        lines.append(f"    {t.source} --> {t.target}: {t.event}")
    for name in spec.terminal:
        lines.append(f"    {name} --> [*]")
    for name in spec.step_states:
        lines.append(
            f"    note right of {name}: step ledger: {', '.join(STEP_EVENTS)}; {CHECKPOINT_EVENT}"
        )
    return "\n".join(lines) + "\n"
