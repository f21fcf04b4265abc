"""The native worker's per-proposal path without Kafka, by stage, against a peer.

The path is what the worker's loop does with a record once the consumer has handed it
over, in the worker's own functions: admit (decode, check key and partition, verify the
signature: Ed25519 as agents sign, and HMAC, each a path of its own), decide (against
the partition transaction: the store's snapshot and proposal ids; the commit's records
encoded), encode the outcome's output records, stage
them (metrics batch, partition transaction), the store's batch per 500 records (built,
then written with its offsets) and the metrics tallied per batch. No broker, no
producer: what one core of Python costs per proposal before Kafka costs anything.

The peer, measured in the same run over the same records: `decide_record` over runs
held in a dict (`RunsInMemory`), the pipeline alone. The ratio says how much the
runtime's store, records and metrics add to deciding.

Usage: python -m benchmarks.path [--proposals 50000] [--rounds 3]
                                [--signatures ed25519,hmac-sha256] [--json]
"""

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.workload import Keys, for_topic, lives
from processor.engine import Beat, Commit, Forget
from processor.kafka.partitioning import partition_for
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines
from processor.observe.metrics import MetricsBatch, WorkerMetrics
from processor.records.limits import DEFAULT_MESSAGE_MAX_BYTES, RecordLimits
from processor.records.outputs import CommitLimits, Source, outcome_records
from processor.records.pipeline import (
    Admitted,
    Outcome,
    Placement,
    RunsInMemory,
    admit_record,
    decide_admitted,
    decide_record,
    outcome_run_id,
)
from processor.runtimes.native.store.changes import PartitionTransaction
from processor.runtimes.native.store.partition import PartitionStore
from processor.trust.keyring import Keyring
from processor.trust.signatures import Algorithm
from schemas import Rejection

STAGES = ("admit", "decide", "encode", "stage", "store", "metrics")
PARTITIONS = 3
#: Records per store batch: the worker's consume batch.
BATCH = 500
_NOW = 1_800_000_000_000


def path_round(
    records: list[Any], keyring: Keyring, topics: TopicNames
) -> tuple[dict[str, float], int]:
    """Seconds per stage over `records`, into fresh stores; and how many committed (a
    path that refused everything, e.g. every signature too old, would look fast)."""
    machines = builtin_machines()
    # As the worker checks commits: against its topics' limits (here the defaults).
    limits = CommitLimits(topics, RecordLimits.learn({}, DEFAULT_MESSAGE_MAX_BYTES))
    metrics = WorkerMetrics(machines, lambda: [], lambda: {})
    spent = dict.fromkeys(STAGES, 0.0)
    commits = 0
    clock = time.perf_counter
    with tempfile.TemporaryDirectory() as tmp:
        stores = {p: PartitionStore(Path(tmp) / str(p)) for p in range(PARTITIONS)}
        txns: dict[int, PartitionTransaction] = {}
        observed = MetricsBatch()
        for n, record in enumerate(records):
            partition = partition_for(record.key.decode(), PARTITIONS)
            txn = txns.get(partition) or txns.setdefault(partition, stores[partition].begin())
            at = _NOW + n
            t0 = clock()
            admitted = admit_record(
                record.key,
                record.value,
                record.headers,
                at,
                topic=topics.proposals,
                keyring=keyring,
                placement=Placement(partition, PARTITIONS),
            )
            t1 = clock()
            outcome: Outcome = (
                decide_admitted(
                    admitted,
                    at,
                    machines=machines,
                    lookup=txn.snapshot,
                    seen=txn.seen,
                    commit_limits=limits,
                )
                if isinstance(admitted, Admitted)
                else admitted
            )
            t2 = clock()
            source = Source(topics.proposals, partition, n, record.key, record.value, at)
            out = outcome_records(topics, outcome, source)
            t3 = clock()
            run_id = outcome_run_id(outcome)
            observed.stage(txn.snapshot(run_id) if run_id else None, outcome)
            if isinstance(outcome, Rejection) and outcome.run_id and txn.snapshot(outcome.run_id):
                txn.stage_refusal(outcome, out[0].value)
            if isinstance(outcome, Commit):
                txn.stage(outcome, out[0].value, out[-1].value)
                commits += 1
            elif isinstance(outcome, Beat):
                txn.stage_beat(outcome, out[-1].value)
            elif isinstance(outcome, Forget):
                txn.stage_forget(outcome.transition.run_id)
            t4 = clock()
            spent["admit"] += t1 - t0
            spent["decide"] += t2 - t1
            spent["encode"] += t3 - t2
            spent["stage"] += t4 - t3
            if (n + 1) % BATCH == 0 or n + 1 == len(records):
                t5 = clock()
                for changes in txns.values():
                    changes.prepare().apply({topics.changelog: n})
                t6 = clock()
                metrics.committed(observed, 0.01, BATCH)
                spent["store"] += t6 - t5
                spent["metrics"] += clock() - t6
                observed, txns = MetricsBatch(), {}
        for store in stores.values():
            store.close()
    return spent, commits


def peer_round(records: list[Any], keyring: Keyring, topics: TopicNames) -> float:
    """Seconds of `decide_record` over `records`, runs in a dict."""
    machines = builtin_machines()
    runs = RunsInMemory()
    began = time.perf_counter()
    for n, record in enumerate(records):
        partition = partition_for(record.key.decode(), PARTITIONS)
        outcome = decide_record(
            record.key,
            record.value,
            record.headers,
            _NOW + n,
            topic=topics.proposals,
            keyring=keyring,
            machines=machines,
            lookup=runs.lookup,
            seen=runs.seen,
            placement=Placement(partition, PARTITIONS),
        )
        runs.apply(outcome)
    return time.perf_counter() - began


def best(rounds: int, measure: Callable[[], float]) -> float:
    return min(measure() for _ in range(rounds))


def measure(algorithm: Algorithm, proposals: int, rounds: int) -> dict[str, Any]:
    """The path and the peer over the lives signed with `algorithm`."""
    keys = Keys.generate(algorithm)
    # Signed long before the records' times: the signature's age is not what is measured.
    keyring = keys.keyring.model_copy(update={"signature_max_age_ms": 10**15})
    topics = TopicNames.with_prefix("path.")
    records = for_topic(lives(keys, max(10, proposals // 10), proposals, 8), keys, topics.proposals)
    n = len(records)
    spent_rounds = []
    for _ in range(rounds):
        spent, commits = path_round(records, keyring, topics)
        if commits < len(records) / 2:
            raise SystemExit(f"only {commits} of {len(records)} committed: not the worker's path")
        spent_rounds.append(spent)
    fastest = min(spent_rounds, key=lambda r: sum(r.values()))
    peer = best(rounds, lambda: peer_round(records, keyring, topics))
    path_s = sum(fastest.values())
    return {
        "proposals": n,
        "rounds": rounds,
        "us_per_proposal": {stage: round(s / n * 1e6, 2) for stage, s in fastest.items()},
        "path_us": round(path_s / n * 1e6, 2),
        "path_per_s": round(n / path_s),
        "peer_us": round(peer / n * 1e6, 2),
        "peer_per_s": round(n / peer),
        "path_over_peer": round(path_s / peer, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proposals", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3, help="Best of this many (3).")
    parser.add_argument(
        "--signatures",
        default=",".join(Algorithm),
        help=f"The input signed with each of these, a path each ({','.join(Algorithm)}).",
    )
    parser.add_argument("--json", action="store_true", help="Print JSON, not a table.")
    args = parser.parse_args()
    try:
        algorithms = [Algorithm(a.strip()) for a in args.signatures.split(",") if a.strip()]
    except ValueError as exc:
        raise SystemExit(f"--signatures: {exc}; choose from {', '.join(Algorithm)}") from None
    results = {str(a): measure(a, args.proposals, args.rounds) for a in algorithms}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for algorithm, result in results.items():
        print(
            f"{result['proposals']:,} proposals of the built-in machines' lives, signed "
            f"{algorithm}; best of {args.rounds} rounds"
        )
        for stage, us in result["us_per_proposal"].items():
            print(f"  {stage:>8}: {us:6.1f} µs/proposal")
        print(
            f"  path: {result['path_us']:.1f} µs ({result['path_per_s']:,}/s); peer, "
            f"decide_record over a dict: {result['peer_us']:.1f} µs "
            f"({result['peer_per_s']:,}/s); path ÷ peer {result['path_over_peer']:.2f}"
        )


if __name__ == "__main__":
    main()
