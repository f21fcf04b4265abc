"""Decisions per second of `decide` on one core, warm snapshot, against a peer.

The peer is a reference design's `transition()`, in memory (dict lookup, retry check,
history append), measured in the same run: the floor cost of "a transition table in Python".
Beside the engine alone, the path a worker runs per record, `decide_record`: a signed
proposal record's bytes decoded, its key and partition checked, its signature verified
(an HMAC keyring, then an Ed25519 one), decided, and the commit's records encoded.
Usage: python benchmarks/engine.py [--n 200000] [--json]
"""

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import JsonValue
from rich.console import Console
from rich.table import Table

from processor.engine import Commit, decide
from processor.kafka.partitioning import partition_for
from processor.machines import builtin_machines
from processor.records.pipeline import Placement, RunsInMemory, decide_record
from processor.trust.keygen import generate_keys
from processor.trust.signatures import Algorithm, RecordHeaders
from schemas import Principal, Proposal, RunSnapshot

RUNTIME = Principal(source="runtime", authority="runtime")
TOOL = Principal(source="tool:get_status", authority="tool_executor")
MODEL = Principal(source="model:planner", authority="model")


def warm_snapshot() -> RunSnapshot:
    machines = builtin_machines()
    snapshot = None
    lives: list[tuple[str, Principal, dict[str, JsonValue]]] = [
        ("create", RUNTIME, {"machine": "owned_run"}),
        ("run_started", RUNTIME, {}),
        ("tool_result", TOOL, {"fact": "build=green"}),
    ]
    for i, (event, principal, payload) in enumerate(lives):
        proposal = Proposal(proposal_id=f"w{i}", run_id="bench", event=event, payload=payload)
        decision = decide(machines, snapshot, proposal, principal, i)
        assert isinstance(decision, Commit)
        snapshot = decision.snapshot
    assert snapshot is not None
    return snapshot


def bench_commits(n: int) -> float:
    """Fact-recording commits, each fed back as the next snapshot (the hot path)."""
    machines = builtin_machines()
    snapshot = warm_snapshot()
    proposals = [
        Proposal(
            proposal_id=f"c{i}", run_id="bench", event="tool_result", payload={"fact": "lint=ok"}
        )
        for i in range(n)
    ]
    start = time.perf_counter()
    for i, proposal in enumerate(proposals):
        decision = decide(machines, snapshot, proposal, TOOL, i)
        snapshot = decision.snapshot  # type: ignore[union-attr]
    return n / (time.perf_counter() - start)


def bench_mixed(n: int) -> float:
    """A realistic mix: 60% commits, 40% refusals (unauthorized, conflicts, illegal)."""
    machines = builtin_machines()
    snapshot = warm_snapshot()
    kinds: list[tuple[str, Principal, dict[str, JsonValue], int | None]] = [
        ("tool_result", TOOL, {"fact": "lint=ok"}, None),
        ("step_started", RUNTIME, {"step": "s", "idempotency_key": "k"}, None),
        ("step_failed", RUNTIME, {"step": "s", "error": "e"}, None),
        ("run_completed", MODEL, {}, None),
        ("run_started", RUNTIME, {}, None),
    ]
    proposals = []
    for i in range(n):
        event, principal, payload, rev = kinds[i % len(kinds)]
        proposals.append(
            (
                Proposal(
                    proposal_id=f"m{i}",
                    run_id="bench",
                    event=event,
                    payload=payload,
                    expected_revision=rev,
                ),
                principal,
            )
        )
    start = time.perf_counter()
    for i, (proposal, principal) in enumerate(proposals):
        decision = decide(machines, snapshot, proposal, principal, i)
        if isinstance(decision, Commit):
            snapshot = decision.snapshot
    return n / (time.perf_counter() - start)


TOPIC = "runstate.proposals"
T0_MS = 1_800_000_000_000
PARTITIONS = 3


def bench_records(n: int, algorithm: Algorithm) -> float:
    """`decide_record` over signed records of one run, as a worker reads them: the run
    created and started, then fact-recording commits, each decided against the snapshot
    the previous one left (kept as `RunsInMemory` keeps it). Records are signed
    beforehand, at their append time."""
    keyring, signers = generate_keys(algorithm)
    runs = RunsInMemory()
    machines = builtin_machines()
    placement = Placement(partition_for("bench", PARTITIONS), PARTITIONS)
    key = b"bench"

    def record(
        i: int, signer: str, event: str, payload: dict[str, JsonValue]
    ) -> tuple[bytes, RecordHeaders, int]:
        proposal = Proposal(proposal_id=f"r{i}", run_id="bench", event=event, payload=payload)
        value = proposal.model_dump_json(exclude_none=True).encode()
        at_ms = T0_MS + i
        return value, signers[signer].headers(TOPIC, key, value, at_ms), at_ms

    def run(records: list[tuple[bytes, RecordHeaders, int]]) -> None:
        for value, headers, at_ms in records:
            outcome = decide_record(
                key,
                value,
                headers,
                at_ms,
                topic=TOPIC,
                keyring=keyring,
                machines=machines,
                lookup=runs.lookup,
                seen=runs.seen,
                placement=placement,
            )
            assert isinstance(outcome, Commit), outcome
            runs.apply(outcome)

    run(
        [
            record(0, "runtime", "create", {"machine": "owned_run"}),
            record(1, "runtime", "run_started", {}),
            record(2, "tool", "tool_result", {"fact": "build=green"}),
        ]
    )
    records = [record(i, "tool", "tool_result", {"fact": "lint=ok"}) for i in range(3, n + 3)]
    start = time.perf_counter()
    run(records)
    return n / (time.perf_counter() - start)


@dataclass
class ReferenceTask:
    """A reference design's task lifecycle `transition()`, in memory, without SQLite: a
    dict from (state, event) to the next state, retry_count raised on `retry`, a history
    entry appended."""

    state: str = "running"
    retry_count: int = 0
    max_retries: int = 3
    history: list[tuple[str, str, str, float]] = field(default_factory=list)


REFERENCE_TABLE = {
    ("running", "transient_error"): "retrying",
    ("retrying", "retry"): "running",
}


def reference_transition(task: ReferenceTask, event: str) -> str:
    nxt = REFERENCE_TABLE.get((task.state, event))
    if nxt is None:
        raise ValueError(f"invalid: {task.state} + {event}")
    if event == "retry":
        task.retry_count += 1
    task.history.append((task.state, nxt, event, time.time()))
    task.state = nxt
    return nxt


def bench_reference_peer(n: int) -> float:
    task = ReferenceTask(max_retries=n)
    events = ["transient_error", "retry"] * (n // 2)
    start = time.perf_counter()
    for event in events:
        reference_transition(task, event)
    return len(events) / (time.perf_counter() - start)


def best_of(fn: Callable[[int], float], n: int, rounds: int) -> float:
    return max(fn(n) for _ in range(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000, help="decisions per round")
    parser.add_argument("--rounds", type=int, default=5, help="best of this many rounds")
    parser.add_argument(
        "--json", action="store_true", help="print the figures as JSON (for make bench)"
    )
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    commits = best_of(bench_commits, args.n, args.rounds)
    mixed = best_of(bench_mixed, args.n, args.rounds)
    # Ed25519 verification is two orders of magnitude slower than HMAC: fewer records.
    n_ed25519 = max(1, args.n // 10)
    hmac_rate = best_of(lambda n: bench_records(n, Algorithm.HMAC_SHA256), args.n, args.rounds)
    ed_rate = best_of(lambda n: bench_records(n, Algorithm.ED25519), n_ed25519, args.rounds)
    peer = best_of(bench_reference_peer, args.n, args.rounds)
    if args.json:
        figures = {
            "commits": commits,
            "mixed": mixed,
            "decide_record_hmac": hmac_rate,
            "decide_record_ed25519": ed_rate,
            "peer": peer,
        }
        print(json.dumps({**figures, "n": args.n, "rounds": args.rounds}))
        return
    table = Table("workload", "decisions/s", "µs each", "vs peer", "aim 100,000/s")
    for label, rate, aimed in (
        ("decide: commits only (fact records)", commits, True),
        ("decide: 60% commits / 40% refusals", mixed, True),
        ("decide_record: signed commits, HMAC keyring", hmac_rate, False),
        ("decide_record: signed commits, Ed25519 keyring", ed_rate, False),
    ):
        met = ("met" if rate >= 100_000 else "not met") if aimed else ""
        table.add_row(label, f"{rate:,.0f}", f"{1e6 / rate:.1f}", f"{rate / peer:.3f}x", met)
    table.add_row(
        "peer: reference transition(), in memory", f"{peer:,.0f}", f"{1e6 / peer:.2f}", "1.000x", ""
    )
    console = Console()
    console.print(table)
    console.print(
        f"one core, warm snapshot, n={args.n:,} per round (decide_record with Ed25519: "
        f"{n_ed25519:,}), best of {args.rounds}"
    )


if __name__ == "__main__":
    main()
