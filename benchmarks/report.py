"""The benchmark's results as JSON and as the markdown of BENCHMARKS.md."""

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


def markdown(results: dict[str, Any]) -> str:
    m, params = results["machine"], results["parameters"]
    native = results["throughput"]["native"]["rate"]["median"]
    lines = [
        "# Benchmarks",
        "",
        f"Produced by `{results['command']}` at commit {m.get('commit', 'unknown')} on "
        f"{m['date']}. Every figure is min / "
        "**median** / max over the repeats; ratios are native ÷ the contender (medians), "
        "all measured in the same run on the same broker.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; {m['os']}; Python "
        f"{m['python']}; Kafka {m['kafka']} (one local broker); confluent-kafka "
        f"{m['confluent_kafka']} (librdkafka {m['librdkafka']}); faust-streaming "
        f"{m['faust_streaming']}; quixstreams {m['quixstreams']}.",
        "",
        f"Input: the built-in machines' lives, {params['proposals']:,} proposals over "
        f"{params['runs']:,} runs, {params['refused_share']:.0%} refused, 3 partitions.",
        "",
        "## Throughput: proposals per second, produced → outcome visible (read committed)",
        "",
        "| contender | proposals/s | native ÷ it | peak memory MB |",
        "|---|---|---|---|",
    ]
    for name, row in results["throughput"].items():
        ratio = native / row["rate"]["median"]
        lines.append(
            f"| {name}: {DESCRIPTIONS[name]} | {_spread_cell(row['rate'])} | {ratio:.2f} | "
            f"{_spread_cell(row['peak_mb'])} |"
        )
    lines += [
        "",
        "## Latency at fixed offered loads (fractions of the native median rate)",
        "",
        "Delay from a proposal's send to its outcome being visible to a read-committed "
        "consumer; one producer offers the load, after a warm-up.",
        "",
        "| load | contender | offered/s | answered/s | p50 ms | p99 ms | native p99 ÷ it "
        "| unanswered |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for load in results["latency"]:
        rows = load["contenders"]
        native_p99 = rows["native"]["p99_ms"] if "native" in rows else float("nan")
        for name, row in rows.items():
            lines.append(
                f"| {load['fraction']:.0%} | {name} | {_fmt(row['offered'])} | "
                f"{_fmt(row['achieved'])} | {_fmt(row['p50_ms'], 1)} | {_fmt(row['p99_ms'], 1)} | "
                f"{native_p99 / row['p99_ms']:.2f} | {row['missing']:,} |"
            )
    growth = results["growth"]
    if growth:
        first, last = min(growth["resident_mb"], key=int), max(growth["resident_mb"], key=int)
        lines += [
            "",
            "## Native worker: memory as runs grow, and restore",
            "",
            "| runs | resident MB |",
            "|---|---|",
            *(f"| {int(r):,} | {_fmt(mb, 1)} |" for r, mb in growth["resident_mb"].items()),
            "",
            f"Growth from {int(first):,} to {int(last):,} runs: "
            f"{_fmt(growth['growth_mb'], 1)} MB. Restore of all {int(last):,} runs from the "
            f"changelog into empty stores: {_fmt(growth['restore_runs_per_s'])} runs/s.",
        ]
    lines += ["", "## Targets (issue 8)", "", "| target | now | met |", "|---|---|---|"]
    for target in results["targets"]:
        lines.append(
            f"| {target['target']} | {target['now']} | {'yes' if target['met'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"
