"""`machine_diff.diff`: each breaking kind of change is named breaking, additions and
widenings compatible, identical machines nothing; generated from the built-in machines,
mutated. And `runstate machines diff` on files."""

import json
from collections.abc import Callable
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.cli.main import cli
from processor.history.machine_diff import BREAKING, COMPATIBLE, diff
from processor.machines import BUILTIN_NAMES, builtin_machines, builtin_source
from schemas.machine import MachineSpec
from tests.examples import examples

Spec = dict[str, Any]
Draw = Callable[..., Any]


def base(name: str) -> Spec:
    return json.loads(builtin_machines()[name].spec.model_dump_json(by_alias=True))


def spec(data: Spec) -> MachineSpec:
    return MachineSpec.model_validate_json(json.dumps(data))


def kinds(old: Spec, new: Spec, impact: str) -> set[str]:
    return {c.kind for c in diff(spec(old), spec(new)) if c.impact == impact}


# Breaking mutations: each changes `data` in place and returns the kind it must be
# reported as. `draw` picks among the machine's own states, events and edges.


def remove_state(data: Spec, draw: Draw) -> str:
    state = draw(st.sampled_from([s for s in data["states"] if s != data["initial"]]))
    data["states"].remove(state)
    for key in ("terminal", "step_states"):
        data[key] = [s for s in data[key] if s != state]
    data["transitions"] = [t for t in data["transitions"] if state not in (t["from"], t["to"])]
    data["timeouts"] = [t for t in data["timeouts"] if t["state"] != state]
    data["alerts"] = [a for a in data["alerts"] if a["state"] != state]
    return "state_removed"


def change_initial(data: Spec, draw: Draw) -> str:
    data["initial"] = draw(st.sampled_from([s for s in data["states"] if s != data["initial"]]))
    return "initial_changed"


def remove_transition(data: Spec, draw: Draw) -> str:
    data["transitions"].pop(draw(st.integers(0, len(data["transitions"]) - 1)))
    return "transition_removed"


def retarget_transition(data: Spec, draw: Draw) -> str:
    edge = draw(st.sampled_from(data["transitions"]))
    edge["to"] = draw(st.sampled_from([s for s in data["states"] if s != edge["to"]]))
    return "transition_retargeted"


def remove_event(data: Spec, draw: Draw) -> str:
    event = draw(st.sampled_from(sorted(data["events"])))
    del data["events"][event]
    data["transitions"] = [t for t in data["transitions"] if t["event"] != event]
    return "event_removed"


def narrow_authorities(data: Spec, draw: Draw) -> str:
    event = data["events"][draw(st.sampled_from(sorted(data["events"])))]
    event["authorities"].remove(draw(st.sampled_from(event["authorities"])))
    return "authorities_narrowed"


def narrow_sources(data: Spec, draw: Draw) -> str:
    event = data["events"][draw(st.sampled_from(sorted(data["events"])))]
    if event["sources"]:
        event["sources"].remove(draw(st.sampled_from(event["sources"])))
        return "sources_narrowed" if event["sources"] else "sources_widened"
    event["sources"] = ["tool:only-this-one"]
    return "sources_narrowed"


def add_guard(data: Spec, draw: Draw) -> str:
    edge = draw(st.sampled_from(data["transitions"]))
    present = {g["kind"] for g in edge["guards"]}
    if "facts_present" in present:
        guard = next(g for g in edge["guards"] if g["kind"] == "facts_present")
        guard["facts"].append("new_fact=yes")
        return "guard_tightened"
    edge["guards"].append({"kind": "facts_present", "facts": ["new_fact=yes"]})
    return "guard_added"


def require_reasons(data: Spec, draw: Draw) -> str:
    edge = draw(st.sampled_from(data["transitions"]))
    if edge["reasons"]:
        edge["reasons"].pop()
        return "reasons_narrowed" if edge["reasons"] else "reasons_dropped"
    edge["reasons"] = ["because"]
    return "reasons_required"


def change_timeout(data: Spec, draw: Draw) -> str:
    if not data["timeouts"]:
        return remove_transition(data, draw)
    index = draw(st.integers(0, len(data["timeouts"]) - 1))
    if draw(st.booleans()):
        data["timeouts"].pop(index)
        return "timeout_removed"
    timeout = data["timeouts"][index]
    timeout["after_ms"] = (timeout["after_ms"] or 1000) + draw(st.integers(1, 10**6))
    return "timeout_changed"


def change_retry(data: Spec, draw: Draw) -> str:
    if data["retry"] is None:
        data["retry"] = {"event": "retry"}
        return "retry_policy_added"
    if draw(st.booleans()):
        data["retry"] = None
        return "retry_policy_removed"
    field = draw(st.sampled_from(["default_max_retries", "backoff_max_ms"]))
    data["retry"][field] += draw(st.integers(1, 100))
    return "retry_policy_changed"


def narrow_create_authorities(data: Spec, draw: Draw) -> str:
    data["create_authorities"].remove(draw(st.sampled_from(data["create_authorities"])))
    return "create_authorities_narrowed"


def change_terminal(data: Spec, draw: Draw) -> str:
    if draw(st.booleans()):
        data["terminal"].remove(draw(st.sampled_from(data["terminal"])))
        return "terminal_removed"
    others = [s for s in data["states"] if s not in data["terminal"]]
    data["terminal"].append(draw(st.sampled_from(others)))
    return "terminal_added"


def shrink_dedupe(data: Spec, draw: Draw) -> str:
    data["dedupe_window"] = draw(st.integers(1, data["dedupe_window"] - 1))
    return "dedupe_window_shrunk"


def drop_step_state(data: Spec, draw: Draw) -> str:
    data["step_states"].remove(draw(st.sampled_from(data["step_states"])))
    return "step_state_removed"


def flip_records_fact(data: Spec, draw: Draw) -> str:
    event = data["events"][draw(st.sampled_from(sorted(data["events"])))]
    event["records_fact"] = not event["records_fact"]
    return "records_fact_changed"


BREAKING_MUTATIONS = [
    remove_state,
    change_initial,
    remove_transition,
    retarget_transition,
    remove_event,
    narrow_authorities,
    narrow_sources,
    add_guard,
    require_reasons,
    change_timeout,
    change_retry,
    narrow_create_authorities,
    change_terminal,
    shrink_dedupe,
    drop_step_state,
    flip_records_fact,
]
# What the mutations above may report that is not breaking (a narrowing that empties a
# list is a widening: no sources means any source, no reasons means none required).
NOT_BREAKING = {"sources_widened", "reasons_dropped"}


# Compatible mutations: additions and widenings, with names of their own (`n` keeps
# two of them apart), so they never undo a breaking mutation.


def add_state_event_edge(data: Spec, draw: Draw, n: int) -> set[str]:
    source = draw(st.sampled_from([s for s in data["states"] if s not in data["terminal"]]))
    state, event = f"extra_state_{n}", f"extra_event_{n}"
    data["states"].append(state)
    data["terminal"].append(state)
    data["events"][event] = {"authorities": ["runtime"]}
    data["transitions"].append({"from": source, "event": event, "to": state})
    return {"state_added", "event_added", "transition_added"}


def widen_authorities(data: Spec, draw: Draw, n: int) -> set[str]:
    known = sorted(e for e in data["events"] if not e.startswith("extra_"))
    event = data["events"][draw(st.sampled_from(known))]
    event["authorities"].append(f"extra_authority_{n}")
    return {"authorities_widened"}


def grow_dedupe(data: Spec, draw: Draw, n: int) -> set[str]:
    data["dedupe_window"] += draw(st.integers(1, 1000))
    return {"dedupe_window_grown"}


def add_alert(data: Spec, draw: Draw, n: int) -> set[str]:
    state = draw(st.sampled_from(data["states"]))
    data["alerts"].append({"rule": f"extra_alert_{n}", "state": state, "after_ms": 1000})
    return {"alert_added"}


def widen_create(data: Spec, draw: Draw, n: int) -> set[str]:
    data["create_authorities"].append(f"extra_creator_{n}")
    return {"create_authorities_widened"}


def add_step_state(data: Spec, draw: Draw, n: int) -> set[str]:
    state = f"extra_step_state_{n}"
    data["states"].append(state)
    data["step_states"].append(state)
    return {"state_added"}


def describe(data: Spec, draw: Draw, n: int) -> set[str]:
    data["description"] += f" (edited {n})"
    return {"description_changed"}


COMPATIBLE_MUTATIONS = [
    add_state_event_edge,
    widen_authorities,
    grow_dedupe,
    add_alert,
    widen_create,
    add_step_state,
    describe,
]
# Besides the breaking mutation: none of these can undo it (grow_dedupe could).
EXTRAS = [m for m in COMPATIBLE_MUTATIONS if m is not grow_dedupe]


def test_identical_machines_report_nothing() -> None:
    for name in BUILTIN_NAMES:
        machine = builtin_machines()[name].spec
        assert diff(machine, machine) == []
        assert diff(machine, spec(base(name))) == []


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    name=st.sampled_from(BUILTIN_NAMES),
    mutation=st.sampled_from(BREAKING_MUTATIONS),
    extras=st.lists(st.sampled_from(EXTRAS), max_size=3),
    data=st.data(),
)
def test_every_breaking_mutation_is_reported_breaking(
    name: str,
    mutation: Callable[[Spec, Draw], str],
    extras: list[Callable[[Spec, Draw, int], set[str]]],
    data: st.DataObject,
) -> None:
    old = base(name)
    new = deepcopy(old)
    if mutation is narrow_create_authorities and not new["create_authorities"]:
        return
    if mutation is drop_step_state and not new["step_states"]:
        return
    expected = mutation(new, data.draw)
    for n, extra in enumerate(extras):
        extra(new, data.draw, n)
    changes = diff(spec(old), spec(new))
    reported = {c.kind: c for c in changes}
    assert expected in reported, (expected, changes)
    if expected in NOT_BREAKING:
        assert reported[expected].impact == COMPATIBLE
    else:
        assert reported[expected].impact == BREAKING, reported[expected]
        assert any(c.breaking for c in changes)
    for change in changes:  # each names what it is about, on one line
        assert change.description and "\n" not in change.description
        what, _, named = change.subject.partition(" ")
        if what in ("state", "event", "transition", "alert"):
            assert named in change.description, change


@settings(max_examples=examples(200), deadline=None)
@given(
    name=st.sampled_from(BUILTIN_NAMES),
    mutations=st.lists(st.sampled_from(COMPATIBLE_MUTATIONS), min_size=1, max_size=4),
    data=st.data(),
)
def test_adding_and_widening_is_compatible(
    name: str,
    mutations: list[Callable[[Spec, Draw, int], set[str]]],
    data: st.DataObject,
) -> None:
    old = base(name)
    new = deepcopy(old)
    expected: set[str] = set()
    for n, mutation in enumerate(mutations):
        expected |= mutation(new, data.draw, n)
    changes = diff(spec(old), spec(new))
    assert changes, "a change that is not reported"
    assert not [c for c in changes if c.breaking], changes
    assert expected <= {c.kind for c in changes}
    # ... and taking them away again breaks: what was added, runs may rely on.
    removals = {c.kind for c in diff(spec(new), spec(old)) if c.breaking}
    for added in ("state", "event", "transition"):
        if f"{added}_added" in expected:
            assert f"{added}_removed" in removals
    if "authorities_widened" in expected:
        assert "authorities_narrowed" in removals


def test_each_description_names_its_state_or_event() -> None:
    old = base("task_lifecycle")
    new = deepcopy(old)
    new["events"]["approval_granted"]["authorities"] = ["lead"]
    new["transitions"] = [t for t in new["transitions"] if t["event"] != "approval_denied"]
    del new["events"]["approval_denied"]
    new["timeouts"] = [t for t in new["timeouts"] if t["state"] != "paused"]
    changes = {c.kind: c for c in diff(spec(old), spec(new))}
    assert "approval_granted" in changes["authorities_narrowed"].description
    assert "approver" in changes["authorities_narrowed"].description
    assert "lead" in changes["authorities_widened"].description
    assert changes["authorities_widened"].impact == COMPATIBLE
    assert "approval_denied" in changes["event_removed"].description
    assert "paused --approval_denied-->" in changes["transition_removed"].description
    assert "paused" in changes["timeout_removed"].description
    assert [c.breaking for c in diff(spec(old), spec(new))] == sorted(
        (c.breaking for c in diff(spec(old), spec(new))), reverse=True
    ), "breaking changes come first"


def test_widening_reasons_and_guards_is_compatible() -> None:
    old = base("owned_run")
    new = deepcopy(old)
    waiting = next(t for t in new["transitions"] if t["event"] == "run_waiting")
    waiting["reasons"].append("operator_hold")
    completed = next(t for t in new["transitions"] if t["event"] == "run_completed")
    completed["guards"] = []
    failed = next(t for t in new["transitions"] if t["event"] == "run_failed")
    failed["reasons"] = []
    tool = new["events"]["tool_result"]
    tool["sources"] = []
    assert kinds(old, new, BREAKING) == set()
    assert kinds(old, new, COMPATIBLE) == {
        "reasons_widened",
        "guard_removed",
        "reasons_dropped",
        "sources_widened",
    }


def test_authority_lists_narrowed_break_widened_do_not() -> None:
    old, new = base("run_state"), base("run_state")
    new["create_authorities"] = ["runtime", "approver"]
    new["step_authorities"] = ["runtime"]
    found = {c.kind: c.impact for c in diff(spec(old), spec(new))}
    assert found == {
        "create_authorities_widened": COMPATIBLE,
        "step_authorities_narrowed": BREAKING,
    }


class LaterSpec(MachineSpec):
    """A machine with a field this diff was not written for."""

    forget_after_ms: int | None = None


def test_a_field_the_diff_does_not_know_is_breaking_until_classified() -> None:
    old = LaterSpec.model_validate_json(json.dumps(base("run_state")))
    new = old.model_copy(update={"forget_after_ms": 1000})
    (change,) = diff(old, new)
    assert change.breaking and change.kind == "forget_after_ms_changed"
    assert "not classified" in change.description
    assert diff(new, new) == []


# The command.


def write(tmp_path: Path, name: str, data: Spec) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_diff_exit_codes_and_json(tmp_path: Path) -> None:
    runner = CliRunner()
    old = tmp_path / "old.yaml"
    old.write_text(builtin_source("task_lifecycle"))
    same = runner.invoke(cli, ["machines", "diff", str(old), "task_lifecycle"])
    assert same.exit_code == 0 and "no changes" in same.output
    assert runner.invoke(cli, ["machines", "diff", str(old), str(old), "--json"]).output == "[]\n"

    widened = base("task_lifecycle")
    widened["events"]["approval_granted"]["authorities"].append("lead")
    compatible = runner.invoke(
        cli,
        ["machines", "diff", str(old), str(write(tmp_path, "wide.yaml", widened))],
        env={"COLUMNS": "200"},
    )
    assert compatible.exit_code == 0, compatible.output
    assert "approval_granted" in compatible.output and "0 breaking, 1 compatible" in (
        compatible.output
    )

    narrowed = base("task_lifecycle")
    narrowed["events"]["approval_granted"]["authorities"] = ["lead"]
    narrowed["transitions"][0]["to"] = "blocked"
    new = write(tmp_path, "narrow.yaml", narrowed)
    table = runner.invoke(cli, ["machines", "diff", str(old), str(new)], env={"COLUMNS": "200"})
    assert table.exit_code == 1, table.output
    assert "planned --start--> now leads to blocked" in table.output
    assert "2 breaking, 1 compatible" in table.output
    listed = runner.invoke(cli, ["machines", "diff", "--json", str(old), str(new)])
    assert listed.exit_code == 1
    changes = json.loads(listed.output)
    assert {(c["kind"], c["breaking"]) for c in changes} == {
        ("authorities_narrowed", True),
        ("authorities_widened", False),
        ("transition_retargeted", True),
    }
    assert all(set(c) == {"impact", "kind", "subject", "description", "breaking"} for c in changes)


@pytest.mark.parametrize("content", ["states: [", "name: x\n"])
def test_cli_diff_a_file_that_does_not_load_exits_2(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    result = CliRunner().invoke(cli, ["machines", "diff", "task_lifecycle", str(bad)])
    assert result.exit_code == 2 and "cannot load" in result.output
    missing = CliRunner().invoke(cli, ["machines", "diff", "task_lifecycle", "nope.yaml"])
    assert missing.exit_code == 2 and "nope.yaml" in missing.output
