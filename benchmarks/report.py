"""The benchmark's results as JSON and as the markdown of BENCHMARKS.md."""

import json
import os
import platform
import statistics
import subprocess
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import confluent_kafka

from benchmarks.contenders import DESCRIPTIONS, ROOT
from benchmarks.quixenv import QUIX
from processor.broker.launcher import KAFKA_VERSION


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def machine() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit or "unknown",
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "kafka": KAFKA_VERSION,
        "confluent_kafka": version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "faust_streaming": version("faust-streaming"),
        "quixstreams": QUIX.split("==")[1],
    }


def _fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def _spread_cell(s: dict[str, float], digits: int = 0) -> str:
    return f"{_fmt(s['min'], digits)} / **{_fmt(s['median'], digits)}** / {_fmt(s['max'], digits)}"


#: The profile of the baseline commit's worker, recorded once (benchmarks/profile.py
#: at that commit) and kept: BENCHMARKS.md shows it beside the profile of its own run.
PROFILE_BEFORE = ROOT / "benchmarks" / "profile-before.json"


def _share(x: float) -> str:
    return f"{x:.0%}"


def _cpu(row: dict[str, Any], field: str) -> str:
    """A median CPU share of a throughput row (absent from older results)."""
    return _share(row[field]["median"]) if field in row else "-"


def _per_proposal(row: dict[str, Any]) -> float | None:
    """The median CPU µs a proposal of a throughput row (absent from older results)."""
    spread = row.get("cpu_us_per_proposal")
    return float(spread["median"]) if spread else None


def markdown(results: dict[str, Any], where: Path = ROOT) -> str:
    """BENCHMARKS.md; `where` is its directory (links to the flame graphs are relative)."""
    m, params = results["machine"], results["parameters"]
    lines = [
        "# Benchmarks",
        "",
        f"Produced by `{results['command']}` at commit {m.get('commit', 'unknown')} on "
        f"{m['date']} in {results['wall_seconds'] / 60:.1f} minutes. Every figure is min / "
        "**median** / max over the repeats; ratios are native ÷ the contender (medians), "
        "all measured in the same run on the same broker. Generated; not edited by hand.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; {m['os']}; Python "
        f"{m['python']}; Kafka {m['kafka']} (one local broker); confluent-kafka "
        f"{m['confluent_kafka']} (librdkafka {m['librdkafka']}); faust-streaming "
        f"{m['faust_streaming']}; quixstreams {m['quixstreams']}.",
        "",
        f"Input: the built-in machines' lives, {params['proposals']:,} proposals over "
        f"{params['runs']:,} runs, {params['refused_share']:.0%} refused, 3 partitions. "
        f"{ceiling_input(params)}Before any measured row, the ceiling drains its input "
        f"{params.get('warmup_drains', 0)} times, untimed, on a broker just started: the "
        "broker's JIT compiles its request paths meanwhile (on a cold broker the first "
        "drain ran at less than half the rate of the next ones).",
        "",
        "The benchmark process (its load generator and its outcome reader, one Python "
        "process with its librdkafka threads) shares the machine with the broker and the "
        "contender: its CPU time over the wall time of each measurement is shown as "
        '"bench CPU", in % of one core; "its CPU" is the contender\'s own (all of its '
        "processes and threads) over the same drain, from its first outcome. Its CPU µs a "
        "proposal is that CPU time over the proposals it answered (each answered by one "
        "outcome, committed to an output topic); native ÷ it per CPU-second is its µs "
        "over native's: how many more proposals native answers for the same CPU. The input "
        "is signed with Ed25519, as agents sign (`runstate keys generate`), but in the row "
        "that says HMAC.",
        "",
        *_throughput(results),
        *_latency_section(
            "Latency at fractions of the ceiling's rate",
            results.get("ceiling_latency") or [],
            results.get("left_out_at_ceiling_loads") or {},
        ),
        *_latency_section("Latency at fractions of the native rate", results["latency"], {}),
        *(_growth(results["growth"]) if results["growth"] else []),
        *_engine(results.get("engine")),
        *_profile(results.get("profile"), results.get("profile_before"), where),
        "## Throughput targets",
        "",
        "| target | now | met |",
        "|---|---|---|",
    ]
    for target in results["targets"]:
        met = {True: "yes", False: "no", None: "not measured"}[target["met"]]
        lines.append(f"| {target['target']} | {target['now']} | {met} |")
    return "\n".join(lines) + "\n"


def _throughput(results: dict[str, Any]) -> list[str]:
    native = results["throughput"]["native"]["rate"]["median"]
    lines = [
        "## Throughput: proposals per second, produced → outcome visible (read committed)",
        "",
        "| contender | proposals/s | native ÷ it | its CPU µs a proposal | native ÷ it per "
        "CPU-second | peak memory MB | its CPU | bench CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = dict(results["throughput"])
    if results.get("pair"):
        rows["native ×2"] = results["pair"]
    native_us = _per_proposal(results["throughput"]["native"])
    for name, row in rows.items():
        ratio = native / row["rate"]["median"]
        us = _per_proposal(row)
        per_cpu = f"{us / native_us:.2f}" if us and native_us else "-"
        lines.append(
            f"| {name}: {DESCRIPTIONS[name]} | {_spread_cell(row['rate'])} | {ratio:.2f} | "
            f"{_spread_cell(row['cpu_us_per_proposal'], 1) if us else '-'} | {per_cpu} | "
            f"{_spread_cell(row['peak_mb'])} | {_cpu(row, 'contender_cpu')} | "
            f"{_cpu(row, 'bench_cpu')} |"
        )
    if results.get("pair"):
        scale = results["pair"]["rate"]["median"] / native
        lines += [
            "",
            f"Two native workers in one group (started and settled before the input is "
            f"loaded; peak memory is the sum of both) drain {scale:.2f}× one worker's rate "
            "on this machine, where the two share its cores with the broker.",
        ]
    return [*lines, ""]


def _latency_section(
    title: str, loads: list[dict[str, Any]], left_out: dict[str, str]
) -> list[str]:
    if not loads:
        return []
    base = loads[0]["base"]
    lines = [
        f"## {title} ({_fmt(base)} proposals/s)",
        "",
        "Delay from a proposal's send to its outcome being visible to a read-committed "
        "consumer; one producer offers the load, after a warm-up. Answered/s counts the "
        "outcomes that became visible during the feed (after its first second); "
        "unanswered: outcomes still missing 60 s after the feed.",
        "",
        "| load | contender | offered/s | answered/s | answered ÷ offered | p50 ms | p99 ms "
        "| native p99 ÷ it | unanswered | bench CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for load in loads:
        rows = load["contenders"]
        native_p99 = rows["native"]["p99_ms"] if "native" in rows else float("nan")
        for name, row in rows.items():
            lines.append(
                f"| {load['fraction']:.0%} | {name} | {_fmt(row['offered'])} | "
                f"{_fmt(row['achieved'])} | {row['answered_ratio']:.3f} | "
                f"{_fmt(row['p50_ms'], 1)} | {_fmt(row['p99_ms'], 1)} | "
                f"{native_p99 / row['p99_ms']:.2f} | {row['missing']:,} | "
                f"{_share(row['bench_cpu'])} |"
            )
    if left_out:
        names = " and ".join(left_out)
        lines += ["", f"Not offered these loads: {names}; each {next(iter(left_out.values()))}."]
    return [*lines, ""]


def _growth(growth: dict[str, Any]) -> list[str]:
    first, last = growth["first_runs"], growth["last_runs"]
    return [
        "## Native worker: memory as runs grow, and restore",
        "",
        "| runs | resident MB |",
        "|---|---|",
        *(f"| {int(r):,} | {_fmt(mb, 1)} |" for r, mb in growth["resident_mb"].items()),
        "",
        f"Growth from {first:,} to {last:,} runs: {_fmt(growth['growth_mb'], 1)} MB. "
        f"Restore of all {last:,} runs from the changelog into empty stores: "
        f"{_fmt(growth['restore_runs_per_s'])} runs/s.",
        "",
    ]


def _engine(engine: dict[str, Any] | None) -> list[str]:
    if not engine:
        return []
    return [
        "## The engine alone (benchmarks/engine.py, one core, warm snapshot)",
        "",
        "| workload | decisions/s |",
        "|---|---|",
        f"| decide: commits only (fact records) | {_fmt(engine['commits'])} |",
        f"| decide: 60 % commits / 40 % refusals | {_fmt(engine['mixed'])} |",
        f"| peer: a reference transition(), in memory | {_fmt(engine['peer'])} |",
        "",
        f"Best of {engine['rounds']} rounds of {engine['n']:,} decisions.",
        "",
    ]


def _profile_label(found: dict[str, Any]) -> str:
    """Whose worker code was profiled (the commit checked out, or the last to change
    processor/ and schemas/), and on which day, for the recorded one."""
    m = found.get("machine") or {}
    code = found.get("checked_out") or f"worker code {found.get('code_commit', '?')}"
    return code + (f", {m['date'][:10]}" if m.get("date") else "")


def _first_clause(error: str) -> str:
    """An error's last line, up to its first parenthesis, for a sentence."""
    line = error.strip().splitlines()[-1] if error.strip() else "no reason given"
    return line.split(" (")[0][:200]


def _profile(after: dict[str, Any] | None, again: dict[str, Any] | None, where: Path) -> list[str]:
    """The per-stage budget: before (recorded; and measured again in this run, when it
    was) and after (this run), side by side."""
    recorded = json.loads(PROFILE_BEFORE.read_text()) if PROFILE_BEFORE.exists() else None
    runs = [
        ("before, recorded", recorded, ROOT / "docs" / "bench" / "flame-before.svg"),
        ("before, this run", again, None),
        ("after, this run", after, None),
    ]
    shown = [
        (label, found, svg or where / found["svg"])
        for label, found, svg in runs
        if found is not None and "error" not in found
    ]
    if not shown:
        return []
    if again is None or "error" in again:
        rerun = (
            "**Before, this run**: not asked for (`--before-commit`)."
            if again is None
            else "**Before, this run**: asked for, but its worker did not run on this "
            f"run's input ({_first_clause(str(again['error']))})."
        )
    else:
        rerun = (
            "**Before, this run**: the same worker code, checked out and profiled again "
            "in this run."
        )
    lines = [
        "## Native worker: time per proposal by stage (py-spy)",
        "",
        "A native worker drains a pre-loaded input while py-spy samples it (250/s, waits "
        "included): its main thread, where the loop runs, shares out its wall time by "
        "stage, as microseconds per proposal (benchmarks/profile.py says which frames "
        "go to which stage). **Before, recorded**: the profile taken of the baseline "
        "commit's worker (benchmarks/profile-before.json, kept as it was measured, on a "
        f"machine as busy as its load average says). {rerun} **After**: this "
        "commit's worker.",
        "",
        "| stage | "
        + " | ".join(f"{label} ({_profile_label(f)}) µs" for label, f, _ in shown)
        + " |",
        "|---|" + "---|" * len(shown),
    ]
    for stage in shown[0][1]["us_per_proposal"]:
        cells = " | ".join(_fmt(f["us_per_proposal"].get(stage, 0.0), 1) for _, f, _ in shown)
        lines.append(f"| {stage} | {cells} |")

    def row(title: str, cell: Any) -> str:
        return f"| {title} | " + " | ".join(cell(f) for _, f, _ in shown) + " |"

    lines += [
        row(
            "**all (wall time per proposal)**",
            lambda f: f"**{_fmt(sum(f['us_per_proposal'].values()), 1)}**",
        ),
        row("proposals/s while sampled", lambda f: _fmt(f["rate"])),
        row("main thread busy (its CPU ÷ wall)", lambda f: _share(f["main_thread_busy"])),
        row("worker process CPU, % of a core", lambda f: _share(f["worker_cpu"])),
        row(
            "machine load average (1 min)",
            lambda f: f"{f['load_average'][0]:.1f}" if f.get("load_average") else "not recorded",
        ),
        row("proposals sampled / samples", lambda f: f"{f['proposals']:,} / {f['samples']:,}"),
        "",
    ]
    links = ", ".join(
        f"[{label}]({os.path.relpath(svg, where)})" for label, _, svg in shown if svg.exists()
    )
    if links:
        lines += [f"Flame graphs of the main thread, coloured by stage: {links}.", ""]
    return lines


def ceiling_input(params: dict[str, Any]) -> str:
    """The sentence saying the ceiling drains a larger input, when it does."""
    scale = params.get("ceiling_scale", 1)
    if scale <= 1:
        return ""
    return (
        f"The ceiling drains {scale} times as many proposals (more lives of the same "
        "machines), so that its drain too lasts seconds: its rate is per second either way. "
    )
