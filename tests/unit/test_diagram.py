"""A machine's diagram: Graphviz's layout read back whole, the fallback without it, and
the SVG drawing every state and every transition once (the browser test measures it)."""

import logging
import re
import shutil
import subprocess
import time

import pytest

from processor.engine import Machine
from processor.machines import builtin_machines
from processor.serving import graphviz
from processor.serving.diagram import columns, dot_source, from_dot_json, svg

MACHINES = builtin_machines()


def _dot(machine: Machine) -> str:
    dot = shutil.which("dot")
    assert dot, "Graphviz's dot is missing: make tools installs it"
    return subprocess.run(
        [dot, "-Tjson"],
        input=dot_source(machine),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_dot_lays_out_every_state_and_transition(name: str) -> None:
    machine = MACHINES[name]
    layout = from_dot_json(machine, _dot(machine))
    assert layout.engine == "dot" and set(layout.boxes) == set(machine.spec.states)
    drawn = sorted((line.source, line.event, line.target) for line in layout.lines)
    assert drawn == sorted((s, e, edge.target) for (s, e), edge in machine.edges.items())
    for line in layout.lines:  # each line and label within the picture
        assert 0 <= line.label_x <= layout.width and 0 <= line.baseline <= layout.height
        assert line.path.startswith("M")


def test_an_answer_of_another_machine_or_no_layout_is_refused() -> None:
    run_state = _dot(MACHINES["run_state"])
    with pytest.raises(ValueError, match="another machine"):
        from_dot_json(MACHINES["task_lifecycle"], run_state)
    for answer in ("", "{}", '{"bb": "0,0,1,1", "objects": [{"_gvid": 0}]}', "[1]"):
        with pytest.raises(ValueError):
            from_dot_json(MACHINES["run_state"], answer)


def test_without_dot_the_diagram_is_in_columns_and_the_log_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(graphviz, "_layouts", {})
    monkeypatch.setattr(graphviz.shutil, "which", lambda name: None)
    with caplog.at_level(logging.INFO, "runstate.http"):
        layout = graphviz.laid_out(MACHINES["owned_run"])
    assert layout.engine == "columns" and "dot is not installed" in caplog.text


def test_a_dot_that_fails_gives_columns_for_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graphviz, "_layouts", {})
    false, dot = shutil.which("false"), shutil.which("dot")
    monkeypatch.setattr(graphviz.shutil, "which", lambda name: false)
    assert graphviz.laid_out(MACHINES["owned_run"]).engine == "columns"
    monkeypatch.setattr(graphviz.shutil, "which", lambda name: dot)  # dot works again
    assert graphviz.laid_out(MACHINES["owned_run"]).engine == "columns"  # kept a while
    now = time.monotonic()
    monkeypatch.setattr(graphviz.time, "monotonic", lambda: now + graphviz._RETRY_S + 1)
    assert graphviz.laid_out(MACHINES["owned_run"]).engine == "dot"  # then asked again


def test_while_one_dot_runs_another_page_is_drawn_in_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(graphviz, "_layouts", {})
    with graphviz._running:  # a dot under way
        assert graphviz.laid_out(MACHINES["run_state"]).engine == "columns"
    assert graphviz.laid_out(MACHINES["run_state"]).engine == "dot"  # not kept: asked now


def test_a_layout_is_made_once_per_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graphviz, "_layouts", {})
    first = graphviz.laid_out(MACHINES["run_state"])
    monkeypatch.setattr(graphviz.shutil, "which", lambda name: None)  # not asked again
    assert graphviz.laid_out(MACHINES["run_state"]) is first and first.engine == "dot"


@pytest.mark.parametrize("engine", ["dot", "columns"])
def test_the_svg_draws_each_state_and_transition_once(engine: str) -> None:
    machine = MACHINES["owned_run"]  # a loop: tool_result, running to running
    layout = from_dot_json(machine, _dot(machine)) if engine == "dot" else columns(machine)
    html = svg(machine, layout, [], "running")
    edges = re.findall(r'<path class="edge[^"]*" [^>]*data-edge="([^"]+)"', html)
    labels = re.findall(r'<text class="label[^"]*" [^>]*data-edge="([^"]+)"', html)
    expected = sorted(f"{s}:{e}" for s, e in machine.edges)
    assert sorted(edges) == sorted(labels) == expected
    assert re.findall(r'data-state="([^"]+)"', html) == list(machine.spec.states)
    if engine == "dot":  # the loop inside its state's group, after the box
        running = html[html.index('data-state="running"') :]
        running = running[: running.index("</g>")]
        assert 'data-edge="running:tool_result"' in running
