"""Machine diagrams as a browser draws them: headless Chromium renders the inspector's
diagram of every built-in machine and of generated ones (many states, long event names,
loops, transitions back, several between the same two states) and measures what it
drew. No label overlaps another label or a state's box (a transition back to the same
state is written inside its box, and must lie inside it), no line runs behind a box
other than its own two ends', every state's name fits its box, and all of it lies
inside the picture. No broker: the diagram is data in, SVG out."""

import random
import shutil
from types import SimpleNamespace
from typing import Any

from processor.engine import Machine
from processor.engine.machine import compile_machine
from processor.machines import builtin_machines
from processor.serving import inspector
from processor.serving.diagram import Layout, columns, svg
from processor.serving.graphviz import laid_out
from schemas.machine import MachineSpec
from tests.examples import examples
from tests.integration.test_inspector_browser import browser

_MEASURE = """
const out = [];
for (const svg of document.querySelectorAll('svg[data-layout]')) {
  const box = r => ({x: r.x, y: r.y, w: r.width, h: r.height});
  out.push({
    machine: svg.getAttribute('aria-label'),
    width: svg.width.baseVal.value, height: svg.height.baseVal.value,
    states: [...svg.querySelectorAll('g.state')].map(g => ({
      state: g.dataset.state,
      rect: box(g.querySelector('rect').getBBox()),
      fill: getComputedStyle(g.querySelector('rect')).fill,
      text: box(g.querySelector('text').getBBox())})),
    labels: [...svg.querySelectorAll('text.label')].map(t => ({
      edge: t.dataset.edge, source: t.dataset.source, rect: box(t.getBBox()),
      fill: getComputedStyle(t).fill})),
    lines: [...svg.querySelectorAll('path.edge')].map(p => {
      const n = p.getTotalLength(), points = [];
      for (let i = 0; i <= 200; i++) {
        const q = p.getPointAtLength(n * i / 200); points.push([q.x, q.y]);
      }
      return {edge: p.dataset.edge, source: p.dataset.source, target: p.dataset.target,
              stroke: getComputedStyle(p).stroke, points};
    }),
  });
}
return out;
"""


def _generated(seed: int) -> Machine:
    """A machine of 3-12 states, each reachable from the first, with extra transitions
    anywhere (loops and ones back among them) and event names up to 30 characters."""
    rng = random.Random(seed)
    n = rng.randint(3, 12)
    states = [f"state_{i}" + "_x" * rng.randint(0, 6) for i in range(n)]
    terminal = states[-rng.randint(1, 2) :]
    events: dict[str, Any] = {}
    transitions = []
    working = [s for s in states if s not in terminal]
    pairs = [(rng.choice(working[:i]), states[i]) for i in range(1, n)]
    for _ in range(rng.randint(0, 2 * n)):
        source = rng.choice(working)
        pairs.append((source, rng.choice(states)))
    for state in states:  # a way out of every state that is no end
        if state not in terminal and all(s != state or t == state for s, t in pairs):
            pairs.append((state, rng.choice(terminal)))
    used: set[tuple[str, str]] = set()
    for i, (source, target) in enumerate(pairs):
        if source in terminal:
            continue
        event = f"e{i}_" + "".join(rng.choice("abcdefgh_") for _ in range(rng.randint(2, 26)))
        if (source, event) in used:
            continue
        used.add((source, event))
        events[event] = {"authorities": ["runtime"]}
        transitions.append({"from": source, "event": event, "to": target})
    spec = {
        "schema_version": 1,
        "name": f"generated_{seed}",
        "states": states,
        "initial": states[0],
        "terminal": terminal,
        "events": events,
        "transitions": transitions,
        "create_authorities": ["runtime"],
        "step_states": [],
    }
    return compile_machine(MachineSpec.model_validate(spec))


def _overlap(a: dict[str, float], b: dict[str, float], margin: float = 0.5) -> bool:
    """Whether two boxes share more than a hairline."""
    return (
        min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"]) > margin
        and min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"]) > margin
    )


def _within(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        b["x"] <= a["x"]
        and a["x"] + a["w"] <= b["x"] + b["w"]
        and b["y"] <= a["y"]
        and a["y"] + a["h"] <= b["y"] + b["h"]
    )


def _inside(point: list[float], r: dict[str, float], margin: float = 1.5) -> bool:
    x, y = point
    return (
        r["x"] + margin < x < r["x"] + r["w"] - margin
        and r["y"] + margin < y < r["y"] + r["h"] - margin
    )


def _problems(drawn: dict[str, Any]) -> list[str]:
    found = []
    boxes = {s["state"]: s["rect"] for s in drawn["states"]}
    picture = {"x": 0.0, "y": 0.0, "w": drawn["width"], "h": drawn["height"]}
    for s in drawn["states"]:
        r, t = s["rect"], s["text"]
        if not _within(t, r):
            found.append(f"the name of {s['state']} is wider than its box")
    labels = drawn["labels"]
    names = {s["state"]: s["text"] for s in drawn["states"]}
    fills = {s["state"]: s["fill"] for s in drawn["states"]}
    loops = {line["edge"]: line for line in drawn["lines"] if line["target"] == line["source"]}
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            if _overlap(a["rect"], b["rect"]):
                found.append(f"labels {a['edge']} and {b['edge']} overlap")
        source, loop = a["source"], loops.get(a["edge"])
        for state, r in boxes.items():
            if loop and state == source:
                if not _within(a["rect"], r) or _overlap(a["rect"], names[state]):
                    found.append(f"loop {a['edge']} is not in its box under its name")
                if fills[state] in (a["fill"], loop["stroke"]):  # unreadable on its box
                    found.append(f"loop {a['edge']} is drawn in its box's own colour")
            elif _overlap(a["rect"], r):
                found.append(f"label {a['edge']} overlaps the box of {state}")
    for line in drawn["lines"]:
        for state, r in boxes.items():
            if state in (line["source"], line["target"]):
                continue
            if any(_inside(p, r) for p in line["points"]):
                found.append(f"the line of {line['edge']} runs behind the box of {state}")
    for thing in [*labels, *drawn["states"]]:
        r = thing["rect"]
        inside = r["x"] >= 0 and r["y"] >= 0
        if not inside or r["x"] + r["w"] > picture["w"] or r["y"] + r["h"] > picture["h"]:
            found.append(f"{thing.get('edge') or thing.get('state')} is outside the picture")
    return found


#: A run of owned_run that took its loop and is in the loop's state: drawn highlighted.
_TOOK_THE_LOOP = [
    SimpleNamespace(from_state=None, to_state="queued", event="create"),
    SimpleNamespace(from_state="queued", to_state="running", event="run_started"),
    SimpleNamespace(from_state="running", to_state="running", event="tool_result"),
]


def _measure(
    pictures: list[tuple[Machine, Layout]], tmp_path: Any, run: tuple[Any, str] | None = None
) -> list[dict[str, Any]]:
    path, current = run or ([], None)
    html = inspector._head("diagrams") + "".join(
        f"<h2>{m.name}</h2>" + svg(m, layout, path, current) for m, layout in pictures
    )
    page = tmp_path / "diagrams.html"
    page.write_text(html + "</body></html>", encoding="utf-8")
    chrome = browser()
    try:
        chrome.get(page.as_uri())
        measured: list[dict[str, Any]] = chrome.execute_script(_MEASURE)
        shot = tmp_path / "diagrams.png"
        chrome.save_screenshot(str(shot))
        print(f"screenshot: {shot}")
    finally:
        chrome.quit()
    assert len(measured) == len(pictures)
    return measured


def test_graphviz_lays_out_every_diagram_with_nothing_overlapping(tmp_path: Any) -> None:
    assert shutil.which("dot"), "Graphviz's dot is missing: make tools installs it"
    machines = [*builtin_machines().values(), *map(_generated, range(examples(24, least=8)))]
    pictures = [(m, laid_out(m)) for m in machines]
    assert {layout.engine for _, layout in pictures} == {"dot"}
    problems = {d["machine"]: p for d in _measure(pictures, tmp_path) if (p := _problems(d))}
    assert not problems, problems
    owned_run = builtin_machines()["owned_run"]
    (drawn,) = _measure([(owned_run, laid_out(owned_run))], tmp_path, (_TOOK_THE_LOOP, "running"))
    assert not _problems(drawn), _problems(drawn)


def test_the_checks_can_fail_the_columns_fallback_overlaps(tmp_path: Any) -> None:
    """The control: without Graphviz, a dense machine's labels cross (the checks above
    find what they look for)."""
    dense = [_generated(seed) for seed in range(6)]
    measured = _measure([(m, columns(m)) for m in dense], tmp_path)
    assert any(_problems(d) for d in measured)
