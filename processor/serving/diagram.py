"""A machine's state diagram: where each state's box, each transition's line and each
label go (a `Layout`), and the SVG drawn from it with a run's path on it. Pure.

Two layouts: Graphviz's `dot` (`graphviz.py` runs it; `dot_source` is its input and
`from_dot_json` reads its answer): ranks left to right, splines routed around the boxes,
every label placed where no other label and no box is. A transition from a state back
to itself is written inside the state's box, under its name (as UML writes an internal
transition), with a loop mark: `dot` places the labels of loops over other labels.
Where `dot` is not installed, `columns`: states in columns by their distance from the
initial state, which a machine with many transitions between the same states draws with
crossing labels."""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from processor.engine import Machine
from schemas.messages import Transition

#: The font the labels are drawn in, and the sizes: the layout measures them a point
#: larger than drawn, so a browser font a little wider than Graphviz's metrics still fits
#: (a loop's line in a box four points larger: the room between it and the name above).
FONT = "Helvetica, Arial, 'Liberation Sans', sans-serif"
STATE_PT, EVENT_PT = 13, 11
_PAD = 20


@dataclass(frozen=True)
class Box:
    x: float  # top-left corner
    y: float
    w: float
    h: float
    baseline: float  # of the state's name, drawn in the middle


@dataclass(frozen=True)
class Line:
    source: str
    event: str
    target: str
    path: str  # SVG path data, ending where the arrow points (a loop: its mark)
    label_x: float  # where the label's baseline starts (anchor "start") or its middle
    baseline: float
    anchor: str = "middle"

    @property
    def loop(self) -> bool:
        return self.source == self.target


@dataclass(frozen=True)
class Layout:
    engine: str  # "dot" or "columns"
    width: float
    height: float
    boxes: dict[str, Box]
    lines: tuple[Line, ...]


def state_label(machine: Machine, state: str) -> str:
    return f"{state} (end)" if state in machine.terminal else state


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dot_source(machine: Machine) -> str:
    """The machine as Graphviz's input: one node per state, one edge per transition."""
    lines = [
        "digraph machine {",
        "  rankdir=LR; nodesep=0.35; ranksep=0.7;",
        f'  node [shape=box style=rounded fontname="Helvetica" fontsize={STATE_PT + 1} '
        'margin="0.18,0.08" height=0.5];',
        f'  edge [fontname="Helvetica" fontsize={EVENT_PT + 1}];',
    ]
    for state in machine.spec.states:
        label = escape(state_label(machine, state))
        for event in _loops(machine, state):
            label += f'<BR/><FONT POINT-SIZE="{EVENT_PT + 4}">{escape(event)}</FONT>'
        lines.append(f"  {_quoted(state)} [label=<{label}>];")
    for (source, event), edge in machine.edges.items():
        if source != edge.target:
            lines.append(f"  {_quoted(source)} -> {_quoted(edge.target)} [label={_quoted(event)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _loops(machine: Machine, state: str) -> list[str]:
    return [e for (s, e), edge in machine.edges.items() if s == state == edge.target]


def _loop_mark(x: float, baseline: float) -> str:
    """A small circle arrow left of a loop's label, from `x` (the label's start)."""
    cx, cy = x - 7, baseline - 4
    return f"M{cx + 3.5:.1f},{cy - 2:.1f} A4,4 0 1 0 {cx + 4:.1f},{cy + 1:.1f}"


def _point(text: str, height: float) -> tuple[float, float]:
    x, y = text.split(",")
    return float(x) + _PAD, height - float(y) + _PAD  # Graphviz's y grows upwards


def from_dot_json(machine: Machine, answer: str) -> Layout:
    """The layout in `dot -Tjson`'s answer for `dot_source(machine)`; ValueError if it
    is not one (a state or a transition missing, a spline not in Graphviz's form)."""
    try:
        graph: dict[str, Any] = json.loads(answer)
        height = float(graph["bb"].split(",")[3])
        width = float(graph["bb"].split(",")[2])
        names: dict[int, str] = {}
        boxes: dict[str, Box] = {}
        lines = []
        for node in graph.get("objects", []):
            state = names[node["_gvid"]] = node["name"]
            cx, cy = _point(node["pos"], height)
            w, h = float(node["width"]) * 72, float(node["height"]) * 72
            # Its name's line, then one line per loop (dot_source's order).
            texts = [op for op in node.get("_ldraw_", []) if op["op"] == "T"]
            loops = _loops(machine, state)
            if len(texts) != 1 + len(loops):
                raise ValueError(f"{len(texts)} lines of text in the box of {state}")
            named = height - float(texts[0]["pt"][1]) + _PAD
            boxes[state] = Box(cx - w / 2, cy - h / 2, w, h, named)
            for event, text in zip(loops, texts[1:], strict=True):
                x, y = float(text["pt"][0]), float(text["pt"][1])
                if text["align"] == "c":
                    x -= float(text["width"]) / 2
                left, baseline = x + _PAD, height - y + _PAD
                mark = _loop_mark(left, baseline)
                lines.append(Line(state, event, state, mark, left, baseline, "start"))
        for edge in graph.get("edges", []):
            source, target = names[edge["tail"]], names[edge["head"]]
            end, controls = None, []
            for token in edge["pos"].split(" "):
                if token.startswith("e,"):
                    end = _point(token[2:], height)
                elif not token.startswith("s,"):
                    controls.append(_point(token, height))
            if len(controls) < 4 or (len(controls) - 1) % 3:
                raise ValueError(f"a spline of {len(controls)} points")
            d = f"M{controls[0][0]:.1f},{controls[0][1]:.1f}"
            for i in range(1, len(controls), 3):
                d += " C" + " ".join(f"{x:.1f},{y:.1f}" for x, y in controls[i : i + 3])
            if end is not None:
                d += f" L{end[0]:.1f},{end[1]:.1f}"
            lx, ly = _point(edge["lp"], height)
            lines.append(Line(source, edge["label"], target, d, lx, ly + 4))
    except (KeyError, TypeError, IndexError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a layout from dot -Tjson: {exc!r}") from exc
    drawn = {(line.source, line.event, line.target) for line in lines}
    wanted = {(s, e, edge.target) for (s, e), edge in machine.edges.items()}
    if set(boxes) != set(machine.spec.states) or drawn != wanted:
        raise ValueError("dot's layout is of another machine")
    return Layout("dot", width + 2 * _PAD, height + 2 * _PAD, boxes, tuple(lines))


_BOX_W, _BOX_H, _COL, _ROW = 150, 40, 210, 70


def columns(machine: Machine) -> Layout:
    """Without Graphviz: columns by breadth-first distance from the initial state, rows
    in the order the machine file lists them; ends in a column of their own at the
    right, unreachable states after them."""
    depth = {machine.spec.initial: 0}
    frontier = [machine.spec.initial]
    while frontier:
        following = []
        for source in frontier:
            for (src, _), edge in machine.edges.items():
                if src == source and edge.target not in depth:
                    depth[edge.target] = depth[source] + 1
                    following.append(edge.target)
        frontier = following
    last = max(depth.values(), default=0)
    rows: dict[int, int] = {}
    boxes = {}
    for state in machine.spec.states:
        if state in machine.terminal and state != machine.spec.initial:
            column = last + 1
        else:
            column = depth.get(state, last + 2)
        row = rows.get(column, 0)
        rows[column] = row + 1
        x, y = _PAD + column * _COL, _PAD + row * _ROW
        boxes[state] = Box(x, y, _BOX_W, _BOX_H, y + _BOX_H / 2 + 4.5)
    lines = []
    for (source, event), edge in machine.edges.items():
        s, t = boxes[source], boxes[edge.target]
        if source == edge.target:  # a loop above the box
            x0, y0 = s.x + s.w - 30, s.y
            d = f"M{x0},{y0} C{x0 - 10},{y0 - 30} {x0 + 30},{y0 - 30} {x0 + 20},{y0}"
            lx, ly = x0 + 5, y0 - 24
        elif t.x == s.x:  # same column: a bow out to the right of both boxes
            x0, y0, y1 = s.x + s.w, s.y + s.h / 2, t.y + t.h / 2
            bow = x0 + 30 + abs(t.y - s.y) / 4
            d = f"M{x0},{y0} C{bow},{y0} {bow},{y1} {x0 + 2},{y1}"
            lx, ly = bow - 6, (y0 + y1) / 2
        elif t.x < s.x:  # backwards: leave from the bottom, arrive at the bottom
            x0, y0 = s.x + s.w / 2, s.y + s.h
            x1, y1 = t.x + t.w / 2, t.y + t.h
            bend = max(y0, y1) + 30
            d = f"M{x0},{y0} C{x0},{bend} {x1},{bend} {x1},{y1}"
            lx, ly = (x0 + x1) / 2, bend - 4
        else:
            x0, y0, x1, y1 = s.x + s.w, s.y + s.h / 2, t.x, t.y + t.h / 2
            d = f"M{x0},{y0} L{x1},{y1}"
            lx, ly = (x0 + x1) / 2, (y0 + y1) / 2 - 4
        lines.append(Line(source, event, edge.target, d, lx, ly))
    width = max(b.x + b.w for b in boxes.values()) + _PAD + 120
    height = max(b.y + b.h for b in boxes.values()) + _PAD + 60
    return Layout("columns", width, height, boxes, tuple(lines))


def svg(machine: Machine, layout: Layout, path: Sequence[Transition], current: str | None) -> str:
    """The diagram with the run's `path` on it (states visited, transitions taken) and
    the state it is in now."""
    visited = {t.to_state for t in path} | {t.from_state for t in path if t.from_state}
    taken = {(t.from_state, t.event) for t in path}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{layout.width:.0f}" '
        f'height="{layout.height:.0f}" role="img" data-layout="{layout.engine}" '
        f'aria-label="state diagram of {escape(machine.name)}">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#8c959f"/></marker></defs>',
    ]
    inside = [line for line in layout.lines if line.loop and layout.engine == "dot"]
    between = [line for line in layout.lines if line not in inside]
    parts += [_line(line, taken, arrow=True) for line in between]
    # Labels after every line, so no line is drawn over a label; a loop's inside its box.
    parts += [_label(line, taken) for line in between]
    for state, box in layout.boxes.items():
        cls = "state"
        if state in visited:
            cls += " visited"
        if state == current:
            cls += " current"
        parts.append(
            f'<g class="{cls}" data-state="{escape(state)}">'
            f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" height="{box.h:.1f}" '
            f'rx="8"/><text x="{box.x + box.w / 2:.1f}" y="{box.baseline:.1f}" '
            f'text-anchor="middle">{escape(state_label(machine, state))}</text>'
            + "".join(
                _line(line, taken, arrow=False) + _label(line, taken)
                for line in inside
                if line.source == state
            )
            + "</g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _line(line: Line, taken: set[tuple[str | None, str]], *, arrow: bool) -> str:
    on_path = " taken" if (line.source, line.event) in taken else ""
    marker = ' marker-end="url(#arrow)"' if arrow else ""
    return (
        f'<path class="edge{on_path}" d="{line.path}"{marker} '
        f'data-edge="{escape(line.source)}:{escape(line.event)}" '
        f'data-source="{escape(line.source)}" data-target="{escape(line.target)}"/>'
    )


def _label(line: Line, taken: set[tuple[str | None, str]]) -> str:
    on_path = " taken" if (line.source, line.event) in taken else ""
    return (
        f'<text class="label{on_path}" x="{line.label_x:.1f}" y="{line.baseline:.1f}" '
        f'text-anchor="{line.anchor}" data-source="{escape(line.source)}" '
        f'data-edge="{escape(line.source)}:{escape(line.event)}">{escape(line.event)}</text>'
    )
