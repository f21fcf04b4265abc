"""Machine diagrams laid out by Graphviz's `dot` (Debian's `graphviz` package; the
worker image has it): once per machine a process asks for, then from memory. Without
`dot`, or when it fails or takes over 5 s, the diagram falls back to columns
(diagram.columns) and the page says why in the log."""

import hashlib
import logging
import shutil
import subprocess
import threading

from processor.engine import Machine
from processor.serving.diagram import Layout, columns, dot_source, from_dot_json

log = logging.getLogger("runstate.http")

_TIMEOUT_S = 5.0
_KEPT = 256  # layouts kept: one per machine version a process serves

_lock = threading.Lock()
_layouts: dict[str, Layout] = {}


def laid_out(machine: Machine) -> Layout:
    source = dot_source(machine)
    key = hashlib.sha256(source.encode()).hexdigest()
    with _lock:
        found = _layouts.get(key)
    if found is not None:
        return found
    layout = _by_dot(machine, source) or columns(machine)
    with _lock:
        if len(_layouts) >= _KEPT:
            _layouts.pop(next(iter(_layouts)))
        _layouts[key] = layout
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
