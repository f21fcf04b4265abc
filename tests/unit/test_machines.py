"""Machines as data: the built-in machines, user files, lint errors that name the line."""

from pathlib import Path

import pytest

from processor.engine import MachineInvalid, compile_machine, lint
from processor.engine.parse import MachineFileError, lint_machine_text, parse_machine
from processor.engine.render import mermaid, table_rows
from processor.machines import BUILTIN_NAMES, builtin_machines, builtin_source, load_catalog

GOOD = """\
schema_version: 1
name: review
states: [drafted, reviewing, merged, dropped]
initial: drafted
terminal: [merged, dropped]
events:
  submit: {authorities: [runtime]}
  approve: {authorities: [approver]}
  drop: {authorities: [runtime, approver]}
transitions:
  - {from: drafted, event: submit, to: reviewing}
  - {from: reviewing, event: approve, to: merged}
  - {from: reviewing, event: drop, to: dropped}
step_states: [reviewing]
"""


def test_builtin_machines_have_their_tables() -> None:
    machines = builtin_machines()
    assert set(machines) == set(BUILTIN_NAMES)
    task = machines["task_lifecycle"].spec
    assert task.states == ["planned", "running", "paused", "blocked", "retrying", "done", "failed"]
    assert len(task.transitions) == 14
    edges = {(t.source, t.event): t.target for t in task.transitions}
    assert edges[("paused", "timeout")] == "failed"
    assert edges[("retrying", "retry")] == "running"
    assert all(s not in {t.source for t in task.transitions} for s in task.terminal)
    run_state = {(t.source, t.event): t.target for t in machines["run_state"].spec.transitions}
    assert run_state == {
        ("pending", "start"): "running",
        ("running", "complete"): "completed",
        ("running", "fail"): "failed",
        ("running", "timeout"): "timeout",
        ("running", "cancel"): "cancelled",
        ("running", "need_approval"): "waiting_approval",
        ("waiting_approval", "approved"): "running",
        ("waiting_approval", "rejected"): "cancelled",
    }
    owned = machines["owned_run"].spec
    assert owned.states == [
        "queued",
        "running",
        "waiting",
        "awaiting_approval",
        "completed",
        "failed",
        "cancelled",
    ]
    assert owned.initial == "queued"


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_builtin_machines_lint_clean(name: str) -> None:
    assert lint_machine_text(builtin_source(name), f"{name}.yaml") == []


def _problems(text: str) -> list[str]:
    return lint_machine_text(text, "m.yaml")


def test_good_user_machine_loads(tmp_path: Path) -> None:
    (tmp_path / "review.yaml").write_text(GOOD)
    catalog = load_catalog([tmp_path])
    assert "review" in catalog and "task_lifecycle" in catalog


def test_user_machine_cannot_shadow_a_builtin(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text(GOOD.replace("name: review", "name: run_state"))
    with pytest.raises(MachineFileError, match="already defined"):
        load_catalog([tmp_path / "x.yaml"])


def test_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MachineFileError, match="cannot read"):
        load_catalog([tmp_path / "missing.yaml"])


def test_unknown_names_point_at_their_line() -> None:
    text = GOOD.replace(
        "{from: reviewing, event: approve, to: merged}",
        "{from: reviewng, event: aprove, to: merged}",
    )
    problems = _problems(text)
    assert "m.yaml:12: transitions.1.from: unknown state 'reviewng'" in problems
    assert "m.yaml:12: transitions.1.event: unknown event 'aprove'" in problems


def test_duplicate_from_event() -> None:
    text = GOOD.replace(
        "  - {from: reviewing, event: drop, to: dropped}\n",
        "  - {from: reviewing, event: drop, to: dropped}\n  - {from: reviewing, event: drop, to: merged}\n",
    )
    problems = _problems(text)
    assert any(
        p.startswith("m.yaml:14:") and "duplicate transition (reviewing, drop)" in p
        for p in problems
    )


def test_terminal_state_with_out_edge() -> None:
    text = GOOD.replace(
        "step_states", "  - {from: merged, event: submit, to: reviewing}\nstep_states"
    )
    problems = _problems(text)
    assert any(p.startswith("m.yaml:14:") and "terminal state 'merged'" in p for p in problems)


def test_unreachable_and_dead_end_states() -> None:
    text = GOOD.replace(
        "states: [drafted, reviewing, merged, dropped]",
        "states: [drafted, reviewing, merged, dropped, limbo]",
    )
    problems = _problems(text)
    assert any(p.startswith("m.yaml:3:") and "'limbo' is unreachable" in p for p in problems)
    assert any("non-terminal state 'limbo' has no way out" in p for p in problems)


def test_dead_end_with_only_a_self_loop() -> None:
    text = GOOD.replace(
        "  - {from: reviewing, event: approve, to: merged}\n  - {from: reviewing, event: drop, to: dropped}\n",
        "  - {from: reviewing, event: approve, to: reviewing}\n"
        "  - {from: drafted, event: drop, to: dropped}\n"
        "  - {from: drafted, event: approve, to: merged}\n",
    )
    assert any("'reviewing' has no way out" in p for p in _problems(text))


def test_structural_problems() -> None:
    text = (
        GOOD.replace("initial: drafted", "initial: merged")
        .replace("terminal: [merged, dropped]", "terminal: [merged, dropped, gone]")
        .replace(
            "  drop: {authorities: [runtime, approver]}",
            "  drop: {authorities: []}\n  create: {authorities: [runtime]}",
        )
        .replace(
            "step_states: [reviewing]",
            "step_states: [nowhere]\nretry: {event: again, exhausted_event: never}",
        )
        .replace("states: [drafted,", "states: [drafted, drafted,")
    )
    problems = "\n".join(_problems(text))
    for needle in (
        "initial state must not be terminal",
        "terminal.2: unknown state 'gone'",
        "no authority may send this event",
        "'create' is a built-in event",
        "step_states.0: unknown state 'nowhere'",
        "retry.event: unknown event 'again'",
        "retry.exhausted_event: unknown event 'never'",
        "duplicate state 'drafted'",
    ):
        assert needle in problems


def test_guard_problems() -> None:
    text = GOOD.replace(
        "{from: reviewing, event: approve, to: merged}",
        "{from: reviewing, event: approve, to: merged, guards: [{kind: retries_exhausted}, {kind: facts_present}]}",
    )
    problems = "\n".join(_problems(text))
    assert "retries_exhausted guard needs a retry policy" in problems
    assert "facts_present lists no facts" in problems


def test_unknown_initial_state() -> None:
    assert any(
        "initial: unknown state 'nope'" in p
        for p in _problems(GOOD.replace("initial: drafted", "initial: nope"))
    )


def test_schema_errors_point_at_their_line() -> None:
    problems = _problems(
        GOOD.replace(
            "  approve: {authorities: [approver]}",
            "  approve: {authorities: [approver], colour: red}",
        )
    )
    assert any(p.startswith("m.yaml:8: events.approve.colour") for p in problems)


def test_not_yaml_and_not_a_mapping() -> None:
    assert _problems("name: [unclosed\n")[0].startswith("m.yaml:")
    assert "is a mapping" in _problems("- a\n- b\n")[0]


def test_compile_rejects_an_unlinted_spec() -> None:
    spec = builtin_machines()["run_state"].spec.model_copy(update={"initial": "nowhere"})
    assert lint(spec)
    with pytest.raises(MachineInvalid, match="initial: unknown state"):
        compile_machine(spec)


def test_render_table_and_mermaid() -> None:
    machine = parse_machine(builtin_source("owned_run"))
    rows = table_rows(machine)
    assert (
        "running",
        "run_completed",
        "completed",
        "runtime",
        "guard success_criteria; guard steps_settled",
    ) in rows
    assert any(r[1] == "tool_result" and "records fact" in r[4] and "tool:*" in r[3] for r in rows)
    assert any("reason in {external_callback}" in r[4] for r in rows)
    assert any(r[1] == "approval_granted" and "approval grant" in r[4] for r in rows)
    task_rows = table_rows(builtin_machines()["task_lifecycle"])
    assert any(r[1] == "retry" and "spends retry budget" in r[4] for r in task_rows)
    assert any("guard retries_exhausted" in r[4] for r in task_rows)
    diagram = mermaid(machine)
    assert diagram.startswith("stateDiagram-v2\n    [*] --> queued\n")
    assert "    running --> completed: run_completed\n" in diagram
    assert "    completed --> [*]\n" in diagram
    guarded = GOOD.replace(
        "to: merged}", "to: merged, guards: [{kind: facts_present, facts: [ci=green]}]}"
    )
    assert any("facts_present(ci=green)" in r[4] for r in table_rows(parse_machine(guarded)))
