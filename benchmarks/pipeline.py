"""Benchmarks side by side on one local broker: the ceiling, the native worker, the Faust
runtime, a Quix Streams app and a reference state machine persisted in SQLite (a commit
per write), fed the same input.

Measures throughput (produced -> outcome visible to a read-committed consumer, from a
pre-loaded topic), also of two native workers in one group; latency p50/p99 at fixed
offered loads (fractions of the ceiling's rate, and of the native rate); the native
worker's resident memory as runs grow and its restore rate from the changelog; the
engine alone (benchmarks/engine.py); and a sampled profile of the native worker, its
time per proposal by stage (benchmarks/profile.py). Writes BENCHMARKS.md and
benchmarks/results.json; `--quick` is a smoke-sized run (not for the committed figures).

Usage: python -m benchmarks.pipeline [--quick] [--contenders native,ceiling,...]
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from benchmarks import profile
from benchmarks.bench import PARTITIONS, Bench
from benchmarks.contenders import CONTENDERS, NATIVE_HMAC, NATIVE_PAIR
from benchmarks.measure import drain, growth_and_restore, latency
from benchmarks.records import RawRecord
from benchmarks.report import machine, markdown, spread
from benchmarks.workload import TOPIC
from processor.broker.provide import provide_broker
from processor.engine import Commit
from processor.machines import builtin_machines
from processor.records.pipeline import decide_record
from processor.trust.keyring import Keyring
from processor.trust.signatures import Algorithm
from schemas.messages import RunSnapshot

FULL: dict[str, Any] = {
    "runs": 5_000,
    "proposals": 50_000,
    "repeats": 3,
    "ceiling_loads": "0.2,0.5",
    # 20 % only: the 50 % row (Faust and SQLite saturated) took ~4 minutes of the 30.
    "loads": "0.2",
    "latency_seconds": 15.0,
    "growth": "10000,100000,1000000",
    "profile": 30_000,
    "before_commit": profile.BEFORE_COMMIT,
    "engine_n": 100_000,
    "warmup_drains": 8,
    "ceiling_scale": 5,
}
QUICK: dict[str, Any] = {
    "runs": 200,
    "proposals": 2_000,
    "repeats": 1,
    "ceiling_loads": "0.2,0.5",
    "loads": "0.2,0.5",
    "latency_seconds": 3.0,
    "growth": "1000,3000",
    "profile": 2_000,
    "before_commit": "",
    "engine_n": 5_000,
    # One: the smoke run checks the warm-up works, not that the broker is warm.
    "warmup_drains": 1,
    "ceiling_scale": 1,
}
ROOT = Path(__file__).resolve().parents[1]
#: Who is offered the loads taken as fractions of the ceiling's rate. Faust (~500/s)
#: and SQLite (~1,700/s) drain less than a fifth of it: offered that, they only grow a
#: backlog for the whole feed and its drain, minutes that tell nothing the native
#: fractions do not.
AT_CEILING_LOADS = ("ceiling", "native", "quix")
LEFT_OUT = (
    "drains far below 20 % of the ceiling's rate: at these loads it only builds a "
    "backlog (see its throughput, and its latency at fractions of the native rate)"
)
#: The Faust runtime's drain rate in `make bench` at 4735c36 (record by record): its target
#: is five times that.
FAUST_BEFORE = 762
#: How long after a feed the outcomes still missing are awaited.
DRAIN_S = 60.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="Comma-separated.")
    parser.add_argument("--runs", type=int, help="Runs in the throughput input (5,000).")
    parser.add_argument("--proposals", type=int, help="Throughput input size (50,000).")
    parser.add_argument("--repeats", type=int, help="Throughput repeats (3).")
    parser.add_argument(
        "--ceiling-loads", help="Offered loads, fractions of the ceiling's rate (0.2,0.5)."
    )
    parser.add_argument(
        "--loads", help="Offered loads, fractions of the native rate (0.2; '' for none)."
    )
    parser.add_argument("--latency-seconds", type=float, help="Timed feed per load (15).")
    parser.add_argument(
        "--growth", help="Run counts for memory and restore (10000,100000,1000000; '' for none)."
    )
    parser.add_argument("--profile", type=int, help="Proposals profiled (30,000; 0: none).")
    parser.add_argument(
        "--before-commit",
        help=f"Profile the worker at this commit too, in this run ({profile.BEFORE_COMMIT}; "
        "'' for none).",
    )
    parser.add_argument("--engine-n", type=int, help="Engine decisions per round (0: none).")
    parser.add_argument(
        "--warmup-drains",
        type=int,
        help="Untimed ceiling drains before any measured row (8; 1 with --quick).",
    )
    parser.add_argument(
        "--ceiling-scale",
        type=int,
        help="The ceiling drains this many times the input, for as long as the worker "
        "drains it (5; 1 with --quick).",
    )
    parser.add_argument(
        "--no-pair", action="store_true", help="Leave out the 2-worker throughput row."
    )
    parser.add_argument(
        "--no-hmac", action="store_true", help="Leave out the HMAC-signed native row."
    )
    parser.add_argument(
        "--quick", action="store_true", help="Smoke-sized defaults: seconds, not figures."
    )
    parser.add_argument("--markdown", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results.json")
    args = parser.parse_args()
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def fractions(text: str) -> list[float]:
    return [float(f) for f in text.split(",") if f.strip()]


def main() -> None:
    began = time.monotonic()
    args = parse_args()
    console = Console()
    chosen = [name.strip() for name in args.contenders.split(",") if name.strip()]
    unknown = set(chosen) - set(CONTENDERS)
    if unknown or "native" not in chosen:
        sys.exit(f"--contenders: need native, and only {', '.join(CONTENDERS)}; got {chosen}")
    results: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.pipeline", shlex.join(sys.argv[1:])]).strip(),
        "machine": machine(),
    }
    with tempfile.TemporaryDirectory() as tmp, provide_broker(Path(tmp) / "broker") as bootstrap:
        bench = Bench(bootstrap, Path(tmp), console)
        plan_records = bench.records(args.runs, args.proposals, seed=8)
        results["parameters"] = {
            "runs": args.runs,
            "proposals": len(plan_records),
            "refused_share": refused_share(bench.keyring, plan_records),
            "repeats": args.repeats,
            "latency_seconds": args.latency_seconds,
            "warmup_drains": args.warmup_drains,
            "ceiling_scale": args.ceiling_scale,
        }
        results["throughput"], results["pair"] = throughput(bench, args, chosen, plan_records)
        rate = {name: row["rate"]["median"] for name, row in results["throughput"].items()}
        results["ceiling_latency"] = (
            latency_rows(
                bench,
                args,
                [n for n in chosen if n in AT_CEILING_LOADS],
                fractions(args.ceiling_loads),
                rate["ceiling"],
            )
            if "ceiling" in chosen
            else []
        )
        results["left_out_at_ceiling_loads"] = {
            n: LEFT_OUT for n in chosen if n not in AT_CEILING_LOADS
        }
        results["latency"] = latency_rows(
            bench, args, chosen, fractions(args.loads or ""), rate["native"]
        )
        results["growth"] = growth(bench, args) if args.growth else None
        if args.profile:
            records = bench.records(max(10, args.profile // 10), args.profile, seed=10)
            results["profile"] = profiled(bench, args, records)
            if args.before_commit:
                results["profile_before"] = profiled(bench, args, records, args.before_commit)
    if args.engine_n:
        results["engine"] = engine(args.engine_n, 1 if args.quick else 3, console)
    results["targets"] = targets(results)
    results["wall_seconds"] = time.monotonic() - began
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    text = markdown(results, args.markdown.parent)
    args.markdown.write_text(text)
    console.print(text)
    console.print(
        f"wrote {args.markdown} and {args.json}; "
        f"the whole benchmark took {results['wall_seconds'] / 60:.1f} minutes"
    )


# Why eight warm-up drains in a full run: a broker just started runs its request paths
# interpreted until the JIT has compiled them. The first drain on it read 10,125/s and
# the next three 22,842-25,773/s, with the broker's C2 compiler thread taking 20-46 % of
# a core beside the contender (top -H), on one of this machine's two. After four, a
# full run's measured ceiling still rose (22,680, then 56,796/s) and the native worker
# drained 7,602-9,315/s; after eight, in one sitting, the ceiling drained
# 49,749-60,241/s and the native worker 10,957-12,093/s.
def warm_up_broker(bench: Bench, records: list[RawRecord], drains: int) -> None:
    """Drain `records` with the ceiling `drains` times, on topics of their own, results
    dropped: every measured row then runs on a broker past its JIT warm-up."""
    for n in range(drains):
        with bench.console.status(f"warming the broker up: drain {n + 1} of {drains}"):
            setup = bench.setup("warmup")
            result = drain(
                setup, CONTENDERS["ceiling"], bench.signed_for(setup, records), PARTITIONS
            )
        bench.console.print(f"warm-up drain {n + 1}: {result.rate:,.0f} proposals/s (not kept)")


def throughput(
    bench: Bench, args: argparse.Namespace, chosen: list[str], records: list[RawRecord]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Drain rates (and peak memory, the contender's CPU per proposal, and this process's
    CPU meanwhile) per contender, interleaved over the repeats; the native worker on
    HMAC-signed input; and two native workers in one group, when asked."""
    extra = [*([] if args.no_hmac else [NATIVE_HMAC]), *([] if args.no_pair else ["native ×2"])]
    names = [*chosen, *extra]
    expected_refused = refused_share(bench.keyring, records)
    rates: dict[str, list[float]] = {name: [] for name in names}
    peaks: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    theirs: dict[str, list[float]] = {name: [] for name in names}
    per_proposal: dict[str, list[float]] = {name: [] for name in names}
    console = bench.console
    # The ceiling drained the input in 0.3 s, where a commit's 10 ms or a collection
    # pause moved its rate by tens of percent (three drains read 24,937 to 168,252/s):
    # it drains a larger input of the same lives, timed over seconds as the others are.
    larger = args.ceiling_scale > 1 and "ceiling" in chosen
    ceiling_records = records
    if larger:
        with console.status(f"walking {args.ceiling_scale}x the input for the ceiling"):
            scale = args.ceiling_scale
            ceiling_records = bench.records(args.runs * scale, len(records) * scale, 8)
    warm_up_broker(bench, ceiling_records, args.warmup_drains)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("throughput", total=args.repeats * len(names))
        for repeat in range(args.repeats):
            for name in names:
                progress.update(task, description=f"throughput: {name}, repeat {repeat + 1}")
                hmac = name == NATIVE_HMAC
                algorithm = Algorithm.HMAC_SHA256 if hmac else Algorithm.ED25519
                setup = bench.setup(name.replace(" ×", "x").split(" ")[0], algorithm)
                mine = bench.signed_for(setup, ceiling_records if name == "ceiling" else records)
                pair = name == "native ×2"
                start = NATIVE_PAIR if pair else CONTENDERS["native" if hmac else name]
                result = drain(setup, start, mine, PARTITIONS, started_first=pair)
                same_rules(name, result.refused, expected_refused)
                rates[name].append(result.rate)
                peaks[name].append(result.peak_mb)
                cpus[name].append(result.bench_cpu)
                theirs[name].append(result.contender_cpu)
                per_proposal[name].append(result.contender_cpu / result.rate * 1e6)
                console.print(
                    f"throughput {name}: {result.rate:,.0f} proposals/s (its CPU "
                    f"{result.contender_cpu:.0%} of a core, {per_proposal[name][-1]:,.1f} µs "
                    f"a proposal; the benchmark's {result.bench_cpu:.0%})"
                )
                progress.advance(task)
    rows = {
        name: {
            "rate": spread(rates[name]),
            "peak_mb": spread(peaks[name]),
            "bench_cpu": spread(cpus[name]),
            "contender_cpu": spread(theirs[name]),
            "cpu_us_per_proposal": spread(per_proposal[name]),
        }
        for name in names
    }
    pair_row = rows.pop("native ×2", None)
    return rows, pair_row


def latency_rows(
    bench: Bench,
    args: argparse.Namespace,
    names: list[str],
    loads: list[float],
    base: float,
) -> list[dict[str, Any]]:
    """For each load (a fraction of `base` proposals/s): each contender offered it for
    the timed feed, the same proposals (signed again for each)."""
    out = []
    for fraction in loads:
        rate = fraction * base
        warmup = 100 if args.quick else 500
        count = int(rate * args.latency_seconds) + warmup
        with bench.console.status(f"walking {count:,} proposals for {rate:,.0f}/s"):
            plan = bench.records(max(10, count // 10), count, seed=9)
        rows: dict[str, Any] = {}
        for name in names:
            with bench.console.status(f"latency at {fraction:.0%} ({rate:,.0f}/s): {name}"):
                setup = bench.setup(name)
                records = bench.signed_for(setup, plan)
                measured = latency(
                    setup, CONTENDERS[name], records, rate, PARTITIONS, warmup, DRAIN_S
                )
            rows[name] = measured.__dict__
            bench.console.print(
                f"latency {fraction:.0%} of {base:,.0f}/s, {name}: answered ÷ offered "
                f"{measured.answered_ratio:.3f}, p50 {measured.p50_ms:.1f} ms, "
                f"p99 {measured.p99_ms:.1f} ms, unanswered {measured.missing}, "
                f"benchmark process {measured.bench_cpu:.0%} of a core"
            )
        out.append({"fraction": fraction, "rate": rate, "base": base, "contenders": rows})
    return out


def growth(bench: Bench, args: argparse.Namespace) -> dict[str, Any]:
    """The native worker's resident memory as runs grow, then its restore rate."""
    console = bench.console
    steps = [int(s) for s in args.growth.split(",")]
    batches, first = [], 0
    setup = bench.setup("growth")
    with console.status("signing the create proposals for the memory runs"):
        for runs in steps:
            batches.append((runs, bench.signed_for(setup, bench.creates(first, runs))))
            first = runs
    with console.status(f"native memory at {', '.join(f'{s:,}' for s in steps)} runs"):
        measured = growth_and_restore(setup, CONTENDERS["native"], batches, PARTITIONS)
    resident = measured.resident_mb
    console.print(f"memory {resident}; restore {measured.restore_runs_per_s:,.0f} runs/s")
    return {
        "resident_mb": {str(k): v for k, v in resident.items()},
        "growth_mb": resident[max(resident)] - resident[min(resident)],
        "restore_runs_per_s": measured.restore_runs_per_s,
        "first_runs": min(resident),
        "last_runs": max(resident),
    }


def profiled(
    bench: Bench, args: argparse.Namespace, records: list[RawRecord], commit: str | None = None
) -> dict[str, Any]:
    """The native worker's budget by stage (profile.py), its flame graph next to the
    markdown; of the worker code at `commit` (a worktree) when given. A machine where
    py-spy may not attach (no ptrace), or a clone without that commit, reports why."""
    name = "flame-before-now.svg" if commit else "flame-after.svg"
    svg = (args.markdown.parent / "docs" / "bench" / name).resolve()
    what = f"the worker at {commit}" if commit else "the native worker"
    with bench.console.status(f"profiling {what} over {len(records):,} proposals"):
        try:
            if commit:
                with profile.checkout(commit) as tree:
                    found = profile.record(bench, records, svg, tree=tree)
                found["checked_out"] = commit
            else:
                found = profile.record(bench, records, svg)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            bench.console.print(f"profile of {what} failed: {exc}")
            return {"error": str(exc)}
    found["svg"] = os.path.relpath(svg, args.markdown.parent)
    bench.console.print(
        f"profile of {what}: {found['rate']:,.0f} proposals/s, main thread busy "
        f"{found['main_thread_busy']:.0%}"
    )
    return found


def engine(n: int, rounds: int, console: Console) -> dict[str, Any]:
    """benchmarks/engine.py's figures, in a process of its own: it pins itself to one
    core, which must not pin this one."""
    with console.status("the engine alone, on one core"):
        done = subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "engine.py"),
                "--n",
                str(n),
                "--rounds",
                str(rounds),
                "--json",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            check=True,
            timeout=900,
        )
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    console.print(f"engine: {figures['commits']:,.0f} commits/s, {figures['mixed']:,.0f} mixed/s")
    return figures


def same_rules(name: str, refused: float, expected: float) -> None:
    """Every contender but the passthrough applies the same rules, so it refuses about
    the share of the input the rules refuse. A peer that refused everything as
    `unauthenticated` (it passed decide_record another topic than the one the input was
    signed for) drained fast and was reported as faster than the worker. Not to the
    point, though: in CI, on a loaded machine, SQLite refused 17.6 % against the rules'
    8.5 % (not read further; likely deadlines, which run on the records' append times
    and so pass more often in a slow drain). What this stops is a peer refusing most of
    the input, or none of it."""
    if name != "ceiling" and (refused > 0.5 or (expected > 0.02 and refused == 0)):
        raise RuntimeError(
            f"{name} refused {refused:.1%} of the input, the rules refuse {expected:.1%}: "
            "it does not decide as the worker does; read its outcomes on the rejections "
            "topic (their codes say why)"
        )


def refused_share(keyring: Keyring, records: list[RawRecord]) -> float:
    """The share of the input the rules refuse (decided in order, as one worker would)."""
    machines, snapshots = builtin_machines(), dict[str, RunSnapshot]()
    refused = 0
    for n, record in enumerate(records):
        outcome = decide_record(
            record.key,
            record.value,
            record.headers,
            1_800_000_000_000 + n,
            topic=TOPIC,
            keyring=keyring,
            machines=machines,
            lookup=snapshots.get,
            seen=lambda _run, _proposal: None,
            placement=None,
        )
        if isinstance(outcome, Commit):
            snapshots[outcome.snapshot.run_id] = outcome.snapshot
        else:
            refused += 1
    return refused / len(records)


def _ratio(rows: dict[str, Any], name: str, field: str) -> float | None:
    if "native" not in rows or name not in rows:
        return None
    value: float = rows["native"][field] / rows[name][field]
    return value


def _at(loads: list[dict[str, Any]], fraction: float) -> dict[str, Any] | None:
    return next((x["contenders"] for x in loads if abs(x["fraction"] - fraction) < 1e-9), None)


def _row(
    target: str,
    now: float | None,
    shown: str,
    *,
    at_least: float | None = None,
    at_most: float | None = None,
) -> dict[str, Any]:
    """A target's row: `now` shown with the format `shown`, met when within its bound."""
    if now is None:
        return {"target": target, "now": "not measured", "value": None, "met": None}
    met = (at_least is None or now >= at_least) and (at_most is None or now <= at_most)
    return {"target": target, "now": shown.format(now), "value": now, "met": met}


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The throughput targets and where they stand (never lowered)."""
    out = []
    rate = {name: row["rate"]["median"] for name, row in results["throughput"].items()}
    for name, wanted in (("ceiling", 0.5), ("quix", 2.5)):
        ratio = rate["native"] / rate[name] if name in rate else None
        out.append(
            _row(
                f"drain throughput, native ÷ {name} ≥ {wanted}",
                ratio,
                "{:.2f}",
                at_least=wanted,
            )
        )
    us = {
        name: row["cpu_us_per_proposal"]["median"]
        for name, row in results["throughput"].items()
        if "cpu_us_per_proposal" in row
    }
    hmac_us = us.get(NATIVE_HMAC)
    out.append(
        _row(
            "native CPU per HMAC-signed proposal ≤ 45 µs",
            hmac_us,
            "{:.1f} µs",
            at_most=45,
        )
    )
    above = us["native"] - hmac_us if hmac_us is not None and "native" in us else None
    out.append(
        _row(
            "native CPU per Ed25519-signed proposal ≤ the HMAC row + 65 µs (one verify)",
            above,
            "+{:.1f} µs",
            at_most=65,
        )
    )
    per_cpu = us["quix"] / us["native"] if "quix" in us and "native" in us else None
    out.append(
        _row(
            "proposals per CPU-second, native ÷ quix ≥ 2",
            per_cpu,
            "{:.2f}",
            at_least=2,
        )
    )
    faust = rate.get("faust")
    out.append(
        _row(
            f"faust ≥ {5 * FAUST_BEFORE:,} proposals/s (5× its {FAUST_BEFORE:,}/s at 4735c36)",
            faust,
            "{:,.0f}/s",
            at_least=5 * FAUST_BEFORE,
        )
    )
    behind = rate["native"] / faust if faust else None
    out.append(
        _row(
            "drain throughput, native ÷ faust ≤ 3",
            behind,
            "{:.2f}",
            at_most=3,
        )
    )
    at20 = _at(results["latency"], 0.2) or {}
    p99 = at20["native"]["p99_ms"] if "native" in at20 else None
    out.append(
        _row(
            "at 20 % of the native rate, native p99 ≤ 50 ms",
            p99,
            "{:.1f} ms",
            at_most=50,
        )
    )
    answered20 = at20["native"]["answered_ratio"] if "native" in at20 else None
    out.append(
        _row(
            "at 20 % of the native rate, native answered ÷ offered ≥ 0.99",
            answered20,
            "{:.3f}",
            at_least=0.99,
        )
    )
    at50 = _at(results["ceiling_latency"], 0.5) or {}
    answered = at50["native"]["answered_ratio"] if "native" in at50 else None
    out.append(
        _row(
            "at 50 % of the ceiling's rate, native answered ÷ offered ≥ 0.99",
            answered,
            "{:.3f}",
            at_least=0.99,
        )
    )
    for fraction, wanted in ((0.5, 2.0), (0.2, 1.3)):
        ratio = _ratio(_at(results["ceiling_latency"], fraction) or {}, "ceiling", "p99_ms")
        out.append(
            _row(
                f"p99 at {fraction:.0%} of the ceiling's rate, native ÷ ceiling ≤ {wanted}",
                ratio,
                "{:.2f}",
                at_most=wanted,
            )
        )
    growth = results["growth"] or {}
    restore, grew = growth.get("restore_runs_per_s"), growth.get("growth_mb")
    first, last = growth.get("first_runs", 10_000), growth.get("last_runs", 1_000_000)
    out.append(
        _row(
            f"restore ≥ 150,000 runs/s ({last:,} runs)",
            restore,
            "{:,.0f} runs/s",
            at_least=150_000,
        )
    )
    out.append(
        _row(
            f"RSS growth {first:,} → {last:,} runs ≤ 150 MB",
            grew,
            "{:.0f} MB",
            at_most=150,
        )
    )
    engine = results.get("engine")
    for kind, label in (("commits", "commits only"), ("mixed", "60 % commits / 40 % refusals")):
        value = engine[kind] if engine else None
        out.append(
            _row(
                f"engine alone, {label}, one core ≥ 100,000 decisions/s",
                value,
                "{:,.0f}/s",
                at_least=100_000,
            )
        )
    return out


if __name__ == "__main__":
    main()
