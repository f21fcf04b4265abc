"""Machine diagrams laid out by Graphviz's `dot` (Debian's `graphviz` package; the
worker image has it): once per machine version a process shows, then from memory.

Without `dot`, or when it fails or takes over 5 s (a machine of a hundred states may),
the diagram is drawn in columns (diagram.columns) and the log says why; that answer is
kept for a minute, then `dot` is asked again. One `dot` runs at a time: a page asked
for meanwhile is drawn in columns rather than wait or start another."""

import logging
import shutil
import subprocess
import threading
import time

from processor.engine import Machine
from processor.serving.diagram import Layout, columns, dot_source, from_dot_json

log = logging.getLogger("runstate.http")

_TIMEOUT_S = 5.0
_RETRY_S = 60.0  # how long a columns layout stands before dot is asked again
_KEPT = 256  # layouts kept: one per machine version a process serves

_lock = threading.Lock()  # the cache
_running = threading.Lock()  # one dot at a time
_layouts: dict[str, tuple[Layout, float]] = {}  # key -> (layout, until: monotonic)


def laid_out(machine: Machine) -> Layout:
    key = machine.version  # the digest of the machine's spec: what the layout is of
    with _lock:
        found = _layouts.get(key)
    if found is not None and time.monotonic() < found[1]:
        return found[0]
    if not _running.acquire(blocking=False):
        return columns(machine)  # another page's dot is running: not kept
    try:
        layout = _by_dot(machine, dot_source(machine))
    finally:
        _running.release()
    until = float("inf") if layout is not None else time.monotonic() + _RETRY_S
    layout = layout or columns(machine)
    with _lock:
        if len(_layouts) >= _KEPT and key not in _layouts:
            _layouts.pop(next(iter(_layouts)))
        _layouts[key] = (layout, until)
    return layout


def _by_dot(machine: Machine, source: str) -> Layout | None:
    dot = shutil.which("dot")
    if dot is None:
        log.info("diagram of %s in columns: Graphviz's dot is not installed", machine.name)
        return None
    try:
        done = subprocess.run(
            [dot, "-Tjson"],
            input=source,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise ValueError(done.stderr.strip()[:300] or f"exit {done.returncode}")
        return from_dot_json(machine, done.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        log.warning("diagram of %s in columns: dot failed: %s", machine.name, exc)
        return None
