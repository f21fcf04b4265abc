"""Benchmarks side by side on one local broker: the ceiling, the native worker, the Faust
runtime, a Quix Streams app and a reference state machine persisted in SQLite (a commit
per write), fed the same input.

Measures throughput (produced -> outcome visible to a read-committed consumer, from a
pre-loaded topic), latency p50/p99 at fixed offered loads (fractions of the native
rate), the native worker's resident memory as runs grow and its restore rate from the
changelog. Writes BENCHMARKS.md and benchmarks/results.json; `--quick` is a smoke-sized
run (not for the committed figures).

Usage: python -m benchmarks.pipeline [--quick] [--contenders native,ceiling,...]
"""

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.progress import Progress

from benchmarks.contenders import CONTENDERS, Setup
from benchmarks.measure import drain, growth_and_restore, latency
from benchmarks.records import RawRecord
from benchmarks.report import machine, markdown, spread
from benchmarks.workload import BENCH_MAX_AGE_MS, TOPIC, for_topic, lives, signed
from processor.broker.provide import provide_broker
from processor.engine import Commit
from processor.keyring import Keyring, dump_keyring, generate_keyring
from processor.machines import builtin_machines
from processor.pipeline import decide_record
from processor.topics import TopicNames, create_topics, plan_topics
from schemas.messages import Proposal, RunSnapshot

PARTITIONS = 3
FULL: dict[str, Any] = {
    "runs": 5_000,
    "proposals": 50_000,
    "repeats": 3,
    "loads": "0.2,0.5",
    "latency_seconds": 15.0,
    "growth": "10000,100000,1000000",
}
QUICK: dict[str, Any] = {
    "runs": 200,
    "proposals": 2_000,
    "repeats": 1,
    "loads": "0.2,0.5",
    "latency_seconds": 3.0,
    "growth": "1000,3000",
}
ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="Comma-separated.")
    parser.add_argument("--runs", type=int, help="Runs in the throughput input (5,000).")
    parser.add_argument("--proposals", type=int, help="Throughput input size (50,000).")
    parser.add_argument("--repeats", type=int, help="Throughput repeats (3).")
    parser.add_argument("--loads", help="Offered loads, fractions of the native rate (0.2,0.5).")
    parser.add_argument("--latency-seconds", type=float, help="Timed feed per load (15).")
    parser.add_argument(
        "--growth", help="Run counts for memory and restore (10000,100000,1000000)."
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


class Bench:
    """One broker, one keyring; a fresh set of topics and a work dir per measurement."""

    def __init__(self, bootstrap: str, tmp: Path, console: Console) -> None:
        self.bootstrap, self.tmp, self.console = bootstrap, tmp, console
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
        self.keyring: Keyring = generate_keyring().model_copy(
            update={"signature_max_age_ms": BENCH_MAX_AGE_MS}
        )
        self.keyring_path = tmp / "keyring.json"
        self.keyring_path.write_text(dump_keyring(self.keyring))

    def setup(self, label: str) -> Setup:
        prefix = f"b-{uuid.uuid4().hex[:8]}."
        create_topics(self.admin, plan_topics(TopicNames.with_prefix(prefix), PARTITIONS, 1))
        workdir = self.tmp / f"{label}-{prefix.rstrip('.')}"
        workdir.mkdir()
        return Setup(
            self.bootstrap, prefix, self.keyring_path, workdir, f"g-{prefix}", self.console
        )

    def signed_for(self, setup: Setup, records: list[RawRecord]) -> list[RawRecord]:
        """`records` signed for this setup's proposals topic, now."""
        return for_topic(records, self.keyring, setup.names.proposals)

    def records(self, runs: int, proposals: int, seed: int) -> list[RawRecord]:
        return lives(self.keyring, runs, proposals, seed)

    def creates(self, first: int, last: int) -> list[RawRecord]:
        return [
            signed(
                self.keyring,
                "runtime",
                Proposal(
                    run_id=f"m-{n}",
                    event="create",
                    payload={"machine": "task_lifecycle"},
                    proposal_id=f"m-{n}",
                ),
            )
            for n in range(first, last)
        ]


def main() -> None:
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
        }
        rates: dict[str, list[float]] = {name: [] for name in chosen}
        peaks: dict[str, list[float]] = {name: [] for name in chosen}
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("throughput", total=args.repeats * len(chosen))
            for repeat in range(args.repeats):
                for name in chosen:
                    progress.update(task, description=f"throughput: {name}, repeat {repeat + 1}")
                    setup = bench.setup(name)
                    mine = bench.signed_for(setup, plan_records)
                    result = drain(setup, CONTENDERS[name], mine, PARTITIONS)
                    rates[name].append(result.rate)
                    peaks[name].append(result.peak_mb)
                    console.print(f"throughput {name}: {result.rate:,.0f} proposals/s")
                    progress.advance(task)
        results["throughput"] = {
            name: {"rate": spread(rates[name]), "peak_mb": spread(peaks[name])} for name in chosen
        }
        native_rate = statistics.median(rates["native"])
        results["latency"] = []
        fractions = [float(f) for f in args.loads.split(",")]
        for fraction in fractions:
            rate = fraction * native_rate
            warmup = 500 if not args.quick else 100
            count = int(rate * args.latency_seconds) + warmup
            rows: dict[str, Any] = {}
            for name in chosen:
                with console.status(f"latency at {fraction:.0%} ({rate:,.0f}/s): {name}"):
                    setup = bench.setup(name)
                    records = bench.signed_for(
                        setup, bench.records(max(10, count // 10), count, seed=9)
                    )
                    measured = latency(setup, CONTENDERS[name], records, rate, PARTITIONS, warmup)
                rows[name] = measured.__dict__
                console.print(
                    f"latency {fraction:.0%} {name}: p50 {measured.p50_ms:.1f} ms, "
                    f"p99 {measured.p99_ms:.1f} ms, unanswered {measured.missing}"
                )
            results["latency"].append({"fraction": fraction, "rate": rate, "contenders": rows})
        steps = [int(s) for s in args.growth.split(",")]
        batches, first = [], 0
        setup = bench.setup("growth")
        with console.status("signing the create proposals for the memory runs"):
            for runs in steps:
                batches.append((runs, bench.signed_for(setup, bench.creates(first, runs))))
                first = runs
        with console.status(f"native memory at {', '.join(f'{s:,}' for s in steps)} runs"):
            growth = growth_and_restore(setup, CONTENDERS["native"], batches, PARTITIONS)
        resident = growth.resident_mb
        results["growth"] = {
            "resident_mb": {str(k): v for k, v in resident.items()},
            "growth_mb": resident[max(resident)] - resident[min(resident)],
            "restore_runs_per_s": growth.restore_runs_per_s,
        }
        console.print(f"memory {resident}; restore {growth.restore_runs_per_s:,.0f} runs/s")
    results["targets"] = targets(results, steps)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    args.markdown.write_text(markdown(results))
    console.print(markdown(results))
    console.print(f"wrote {args.markdown} and {args.json}")


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


def targets(results: dict[str, Any], steps: list[int]) -> list[dict[str, Any]]:
    """Issue 8's targets and where they stand (never lowered)."""
    rate = {name: row["rate"]["median"] for name, row in results["throughput"].items()}
    native = rate["native"]
    out = []
    for name, wanted in (("ceiling", 0.5), ("quix", 2.0), ("faust", 10.0)):
        if name in rate:
            ratio = native / rate[name]
            out.append(
                {
                    "target": f"native ≥ {wanted}× {name}",
                    "now": f"{ratio:.2f}×",
                    "met": ratio >= wanted,
                }
            )
    at20 = next((x for x in results["latency"] if abs(x["fraction"] - 0.2) < 1e-9), None)
    if at20 is not None:
        p99 = at20["contenders"]["native"]["p99_ms"]
        out.append(
            {"target": "native p99 at 20% load ≤ 250 ms", "now": f"{p99:.0f} ms", "met": p99 <= 250}
        )
    growth = results["growth"]
    out.append(
        {
            "target": "restore ≥ 100,000 runs/s",
            "now": f"{growth['restore_runs_per_s']:,.0f} runs/s",
            "met": growth["restore_runs_per_s"] >= 100_000,
        }
    )
    out.append(
        {
            "target": f"memory growth {steps[0]:,} → {steps[-1]:,} runs < 200 MB",
            "now": f"{growth['growth_mb']:.0f} MB",
            "met": growth["growth_mb"] < 200,
        }
    )
    return out


if __name__ == "__main__":
    main()
