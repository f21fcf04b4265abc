"""Where a native worker's time goes per proposal: a sampled profile (py-spy) of its main
thread while it drains a pre-loaded input, as microseconds per proposal by stage, and a
flame graph (SVG) of the same samples.

The worker's loop runs on its main thread, and every stage of a proposal happens there:
consume, decode, authenticate, decide, hash, encode, produce, stage, commit, the store
and producer flushes, metrics and logs. Waits count (py-spy's --idle): a loop blocked
on its transaction's commit is not deciding either. A sample is given the stage of the
innermost frame a rule knows (by function and module), so the table's rows add up to
the main thread's wall time per proposal; the C calls of confluent-kafka and rocksdict
have no Python frame, so the line of the frame calling them says which call it is.

Usage: python -m benchmarks.profile [--proposals 30000] [--json F] [--svg F]
"""

import argparse
import dataclasses
import html
import json
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.bench import PARTITIONS, Bench
from benchmarks.contenders import CONTENDERS, ROOT, Running, Setup
from benchmarks.measure import Tail, load
from benchmarks.records import RawRecord
from benchmarks.report import machine
from processor.broker.provide import provide_broker

#: The stages of the budget, in the order of a proposal's path through the loop.
STAGES = (
    "consume",
    "decode",
    "authenticate",
    "decide",
    "hash",
    "encode",
    "produce",
    "stage",
    "commit",
    "store flush",
    "producer flush",
    "metrics",
    "logs",
    "timers",
    "other",
)
SAMPLE_RATE = 250
#: The baseline commit, before the hot path's work: its worker is the budget's "before".
BEFORE_COMMIT = "a587d34"
MAIN_THREAD = "MainThread"
FRAME = re.compile(r"^(?P<func>.*) \((?P<path>.*):(?P<line>\d+)\)$")

Frame = tuple[str, str, int]  # function (qualified), file, line
Stack = tuple[Frame, ...]  # outermost first


# -- classifying samples ------------------------------------------------------------
#: The package of the native worker's partition store (a module per job); before it,
#: all of the store was native/store.py (runtime/store.py in the flat layout).
_STORE_PACKAGE = "/native/store/"


def _in_store(path: str) -> bool:
    """Whether `path` (as this layout names it) is a module of a partition store."""
    return _STORE_PACKAGE in path or path.endswith("native/store.py")


def _c_call(path: str, line: int) -> str | None:
    """The stage of the C call the innermost Python frame is in, by its source line
    (confluent-kafka's and rocksdict's methods have no frame of their own)."""
    text = linecache.getline(path, line)
    if not text or "/processor/" not in path:
        return None
    for needle in ("commit_transaction", "send_offsets_to_transaction", "abort_transaction"):
        if needle in text:
            return "commit"
    if "begin_transaction" in text:
        return "produce"
    if ".consume(" in text:
        return "consume"
    if ".flush(" in text and "producer" in path:
        return "producer flush"
    if ".produce(" in text or ".poll(" in text:
        return "produce"
    if ".write(" in text and "store" in path:
        return "store flush"
    return None


#: The baseline commit's worker has the flat layout of processor/: its modules' paths as
#: they are in this layout, so that both profiles are classified by the same rules.
_FLAT_LAYOUT = {
    "logs.py": "observe/logs.py",
    "metrics.py": "observe/metrics.py",
    "signatures.py": "trust/signatures.py",
    "keyring.py": "trust/keyring.py",
    "intake.py": "records/intake.py",
    "outputs.py": "records/outputs.py",
    "pipeline.py": "records/pipeline.py",
    "partitioning.py": "kafka/partitioning.py",
    "punctuator.py": "records/punctuator.py",
    "runtime/checkpoint.py": "runtimes/native/transaction.py",
}


def _in_layout(path: str) -> str:
    """`path` as this layout names the module (the same path when it is already)."""
    head, sep, tail = path.rpartition("/processor/")
    if not sep:
        return path
    if tail in _FLAT_LAYOUT:
        tail = _FLAT_LAYOUT[tail]
    elif tail.startswith("runtime/"):
        tail = "runtimes/native/" + tail.removeprefix("runtime/")
    return f"{head}{sep}{tail}"


def _frame_stage(func: str, path: str) -> str | None:
    """The stage a frame belongs to, or None when its caller's says (helpers)."""
    name = func.rsplit(".", 1)[-1]
    path = _in_layout(path)
    if (
        "/logging/" in path
        or "pythonjsonlogger" in path
        or path.endswith("processor/observe/logs.py")
    ):
        return "logs"
    if "prometheus_client" in path or path.endswith("processor/observe/metrics.py"):
        return "metrics"
    if "rfc8785" in path or path.endswith("schemas/audit.py"):
        return "hash"
    if path.endswith(("processor/trust/signatures.py", "processor/trust/keyring.py", "/hmac.py")):
        return "authenticate"
    if path.endswith("processor/records/intake.py"):
        if name in ("authenticate", "reject_unproven"):
            return "authenticate"
        return "decode" if name in ("decode_proposal", "refuse", "_finite") else None
    if (
        path.endswith(
            (
                "processor/records/outputs.py",
                "processor/records/changelog_keys.py",
                "processor/records/limits.py",
            )
        )
        or name == "fit_commit"
    ):
        return "encode"
    if _in_store(path) or path.endswith("native/stores.py"):
        return "store flush" if name in ("write", "flush", "_drop_run") else "stage"
    if path.endswith("native/producer.py"):
        committing = name in (
            "commit",
            "commit_here",
            "start_commit",
            "wait",
            "_travel",
            "abort",
            "bounded",
            "abort_transaction",
        )
        return "commit" if committing else "produce"
    if path.endswith("native/transaction.py"):
        return {
            "produce": "produce",
            "settled": "produce",  # the records held while the previous commit travelled
            "commit": "commit",
            "start_commit": "commit",
            "finish_commit": "commit",
            "abort": "commit",
            "store": "stage",
        }.get(name)
    if "/processor/engine/" in path or path.endswith(
        ("processor/records/pipeline.py", "processor/kafka/partitioning.py")
    ):
        return "decide"
    if path.endswith("processor/records/punctuator.py") or name == "_punctuate":
        return "timers"
    return None


_STORE_FLUSH = (".write", ".prepare", ".apply", "._drop_run")


def classify(stack: Stack) -> str:
    """The stage of one sample: the innermost frame a rule knows decides; anything under
    a store's batch being built or written is the store flush (its lookups included)."""
    if any(f.endswith(_STORE_FLUSH) and _in_store(_in_layout(p)) for f, p, _ in stack):
        return "store flush"
    if stack:
        _, path, line = stack[-1]
        called = _c_call(path, line)
        if called is not None:
            return called
    for func, path, _ in reversed(stack):
        stage = _frame_stage(func, path)
        if stage is not None:
            return stage
    return "other"


def parse_raw(text: str, thread: str = MAIN_THREAD) -> Counter[Stack]:
    """py-spy's raw output (--threads: 'thread (tid): name;frame;frame count') -> the
    samples of the thread named `thread`, by stack."""
    stacks: Counter[Stack] = Counter()
    for row in text.splitlines():
        body, _, count = row.rpartition(" ")
        if not body.startswith("thread (") or not count.isdigit():
            continue
        _, _, names = body.partition("): ")
        parts = names.split(";")
        if parts[0] != thread:
            continue
        frames = []
        for part in parts[1:]:
            match = FRAME.match(part)
            if match is not None:
                frames.append((match["func"], match["path"], int(match["line"])))
        stacks[tuple(frames)] += int(count)
    return stacks


def budget(
    stacks: Counter[Stack], seconds: float, proposals: int
) -> tuple[dict[str, float], dict[str, int]]:
    """Microseconds per proposal by stage (the main thread's wall time over the window,
    shared out by samples), and the samples by stage."""
    samples: Counter[str] = Counter()
    for stack, count in stacks.items():
        samples[classify(stack)] += count
    total = sum(samples.values()) or 1
    per = seconds / proposals * 1e6
    return (
        {stage: samples[stage] / total * per for stage in STAGES},
        {stage: samples[stage] for stage in STAGES},
    )


# -- the flame graph ----------------------------------------------------------------
COLOURS = {
    "consume": "#9ecae1",
    "decode": "#fdae6b",
    "authenticate": "#fd8d3c",
    "decide": "#e6550d",
    "hash": "#a63603",
    "encode": "#fdd0a2",
    "produce": "#6baed6",
    "stage": "#a1d99b",
    "commit": "#3182bd",
    "store flush": "#31a354",
    "producer flush": "#08519c",
    "metrics": "#bcbddc",
    "logs": "#9e9ac8",
    "timers": "#fee391",
    "other": "#d9d9d9",
}


def _short(path: str) -> str:
    for root in ("/processor/", "/schemas/", "/site-packages/", "/lib/python"):
        if root in path:
            return path[path.index(root) + 1 :]
    return Path(path).name


def flame_svg(stacks: Counter[Stack], title: str, width: float = 1200.0) -> str:
    """An icicle flame graph of `stacks` (outermost frame on top), each box coloured by
    the stage its samples go to, with the count and share in its tooltip."""
    tree: dict[str, Any] = {"count": 0, "children": {}, "stack": ()}
    for stack, count in stacks.items():
        node = tree
        node["count"] += count
        for depth, (func, path, _) in enumerate(stack):
            label = f"{func} ({_short(path)})"
            node = node["children"].setdefault(
                label, {"count": 0, "children": {}, "stack": stack[: depth + 1]}
            )
            node["count"] += count
    total = tree["count"] or 1
    row, top = 17, 40
    boxes: list[str] = []
    deepest = 0

    def walk(node: dict[str, Any], label: str, x: float, depth: int) -> None:
        nonlocal deepest
        w = node["count"] / total * width
        if w < 0.5:
            return
        deepest = max(deepest, depth)
        stage = classify(node["stack"]) if node["stack"] else "other"
        tip = f"{label}: {node['count']} samples, {node['count'] / total:.1%} ({stage})"
        text = label if len(label) * 6.5 < w else label[: max(0, int(w / 6.5) - 2)] + ".."
        y = top + depth * row
        boxes.append(
            f'<g><title>{html.escape(tip)}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" '
            f'height="{row - 1}" fill="{COLOURS[stage]}" rx="2"/>'
            + (f'<text x="{x + 3:.1f}" y="{y + 12}">{html.escape(text)}</text>' if w > 20 else "")
            + "</g>"
        )
        for child_label, child in sorted(node["children"].items()):
            walk(child, child_label, x, depth + 1)
            x += child["count"] / total * width

    walk(tree, f"{MAIN_THREAD}: all samples", 0.0, 0)
    legend, x, y = [], 10.0, top + (deepest + 2) * row
    for stage in STAGES:  # a key of the colours, each as wide as its name
        legend.append(
            f'<rect x="{x:.0f}" y="{y}" width="12" height="12" fill="{COLOURS[stage]}"/>'
            f'<text x="{x + 16:.0f}" y="{y + 11}">{html.escape(stage)}</text>'
        )
        x += 16 + 7 * len(stage) + 14
    height = top + (deepest + 4) * row
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
        f'font-family="monospace" font-size="11">'
        f'<text x="10" y="20" font-size="14">{html.escape(title)}</text>'
        + "".join(boxes)
        + "".join(legend)
        + "</svg>\n"
    )


# -- recording a worker -------------------------------------------------------------
def py_spy() -> str:
    """py-spy from the dev extras (next to this Python), else from PATH."""
    here = Path(sys.executable).with_name("py-spy")
    found = str(here) if here.exists() else shutil.which("py-spy")
    if found is None:
        raise RuntimeError("py-spy is missing: pip install -e '.[worker,dev]'")
    return found


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """CPU time (user + system) of a process, or of one of its threads."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """A worktree of this repository at `commit`, removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        git = ["git", "-C", str(ROOT)]
        subprocess.run(
            [*git, "worktree", "add", "--detach", str(tree), commit],
            check=True,
            capture_output=True,
        )
        try:
            yield tree
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=False)


@contextmanager
def code_of(tree: Path | None) -> Iterator[None]:
    """Processes started within run the worker code of `tree` (another checkout), not
    this one's: `python -m` puts the working directory first on the path."""
    if tree is None:
        yield
        return
    cwd, path = os.getcwd(), os.environ.get("PYTHONPATH")
    os.chdir(tree)
    os.environ["PYTHONPATH"] = str(tree)
    try:
        yield
    finally:
        os.chdir(cwd)
        if path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = path


def record(
    bench: Bench,
    records: list[RawRecord],
    out: Path,
    rate: int = SAMPLE_RATE,
    keep: Path | None = None,
    tree: Path | None = None,
) -> dict[str, Any]:
    """Drain `records` with a native worker under py-spy; the stage budget as a dict,
    and the flame graph written to `out` (an SVG); py-spy's samples copied to `keep`.
    `tree`: run the worker code of that checkout instead of this one's."""
    setup = bench.setup("profile")
    if tree is not None:
        setup = in_older_format(setup)
    mine = bench.signed_for(setup, records)
    load(setup, mine)
    with code_of(tree):
        running = CONTENDERS["native"](setup)
    tail = Tail(setup, PARTITIONS)
    tail.expect(mine)
    stacks_file = setup.workdir / "stacks.txt"
    try:
        deadline = time.monotonic() + 300
        while tail.first_seen is None:  # start-up and restore are not the budget
            if time.monotonic() > deadline:
                raise TimeoutError("the worker answered nothing within 300 s")
            tail.take(0.01, running)
        result = {
            **_sampled(running, tail, stacks_file, rate, out),
            "code_commit": code_commit(tree),
        }
        if keep is not None:
            shutil.copyfile(stacks_file, keep)
        return result
    finally:
        tail.close()
        running.stop()


#: Key flags a keyring file gained after the baseline: its worker refuses them as unknown.
_NEWER_KEY_FIELDS = ("operator", "processor")


def in_older_format(setup: Setup) -> Setup:
    """`setup` with its keyring file written without the key flags the baseline's worker
    predates (it would refuse the file): the same keys, so the same input verifies."""
    data = json.loads(setup.keyring_path.read_text())
    for key in data["keys"].values():
        for name in _NEWER_KEY_FIELDS:
            key.pop(name, None)
    older = setup.workdir / "keyring-older.json"
    older.write_text(json.dumps(data, indent=2) + "\n")
    return dataclasses.replace(setup, keyring_path=older)


def _sampled(
    running: Running, tail: Tail, stacks_file: Path, rate: int, out: Path
) -> dict[str, Any]:
    pid = running.proc.pid
    spy = subprocess.Popen(
        [
            py_spy(),
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--format",
            "raw",
            "--threads",
            "--idle",
            "--full-filenames",
            "-o",
            str(stacks_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    answered, began = tail.answered, time.monotonic()
    main_cpu, worker_cpu = cpu_seconds(pid, pid), cpu_seconds(pid)
    tail.until_answered(900, running)
    seconds = time.monotonic() - began
    main_cpu, worker_cpu = cpu_seconds(pid, pid) - main_cpu, cpu_seconds(pid) - worker_cpu
    proposals = tail.answered - answered
    spy.send_signal(signal.SIGINT)  # py-spy writes its samples on Ctrl-C
    _, err = spy.communicate(timeout=60)
    if not stacks_file.exists():
        raise RuntimeError(f"py-spy wrote nothing: {err.decode(errors='replace')[-2000:]}")
    stacks = parse_raw(stacks_file.read_text())
    per_stage, samples = budget(stacks, seconds, proposals)
    title = (
        f"native worker, main thread: {proposals:,} proposals in {seconds:.1f} s, "
        f"{sum(samples.values()):,} samples at {rate}/s (idle included)"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(flame_svg(stacks, title))
    return {
        "load_average": os.getloadavg(),  # what else ran: a busy machine stretches waits
        "proposals": proposals,
        "seconds": seconds,
        "rate": proposals / seconds,
        "sample_rate": rate,
        "samples": sum(samples.values()),
        "main_thread_busy": main_cpu / seconds,
        "worker_cpu": worker_cpu / seconds,
        "us_per_proposal": per_stage,
        "samples_by_stage": samples,
        "svg": str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out),
    }


def code_commit(tree: Path | None = None) -> str:
    """The last commit that changed the worker's code (processor/, schemas/): what a
    profile measures, whatever benchmark commit ran it."""
    return subprocess.run(
        ["git", "log", "-1", "--format=%h", "--", "processor", "schemas"],
        cwd=tree or ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--proposals", type=int, default=30_000, help="Input size (30,000).")
    parser.add_argument("--runs", type=int, default=3_000, help="Runs in the input (3,000).")
    parser.add_argument("--rate", type=int, default=SAMPLE_RATE, help="Samples per second.")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "profile.json")
    parser.add_argument("--svg", type=Path, default=ROOT / "docs" / "bench" / "flame.svg")
    parser.add_argument("--stacks", type=Path, help="Keep py-spy's raw samples here.")
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp, provide_broker(Path(tmp) / "broker") as bootstrap:
        bench = Bench(bootstrap, Path(tmp), console)
        with console.status("signing the input"):
            records = bench.records(args.runs, args.proposals, seed=8)
        with console.status(f"profiling a native worker over {len(records):,} proposals"):
            found = record(bench, records, args.svg.resolve(), args.rate, args.stacks)
    result = {"machine": machine(), **found}
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    for stage, us in result["us_per_proposal"].items():
        console.print(f"{stage:>15}: {us:8.1f} µs/proposal")
    console.print(
        f"main thread busy {result['main_thread_busy']:.0%}, worker CPU "
        f"{result['worker_cpu']:.0%} of a core, {result['rate']:,.0f} proposals/s; "
        f"wrote {args.json} and {args.svg}"
    )


if __name__ == "__main__":
    main()
