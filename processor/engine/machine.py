"""A linted machine compiled for fast lookups by `decide`."""

from collections.abc import Mapping
from dataclasses import dataclass, field

from processor.engine.lint import LintIssue, lint
from schemas.machine import EventSpec, Guard, MachineSpec, TransitionSpec


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
class Machine:
    spec: MachineSpec
    edges: Mapping[tuple[str, str], Edge]
    terminal: frozenset[str]
    step_states: frozenset[str]
    step_authorities: frozenset[str]
    create_authorities: frozenset[str]
    events: Mapping[str, EventSpec] = field(repr=False)

    @property
    def name(self) -> str:
        return self.spec.name


def _edge(t: TransitionSpec) -> Edge:
    return Edge(t.source, t.event, t.target, frozenset(t.reasons), tuple(t.guards), t.stop_reason)


def compile_machine(spec: MachineSpec) -> Machine:
    """Lint `spec` and build its lookup tables; raises MachineInvalid on any issue."""
    issues = lint(spec)
    if issues:
        raise MachineInvalid(spec.name, issues)
    return Machine(
        spec=spec,
        edges={(t.source, t.event): _edge(t) for t in spec.transitions},
        terminal=frozenset(spec.terminal),
        step_states=frozenset(spec.step_states),
        step_authorities=frozenset(spec.step_authorities),
        create_authorities=frozenset(spec.create_authorities),
        events=dict(spec.events),
    )
