"""Restore after retention: a store whose changelog held N finished runs, all forgotten
and compacted away, restores as fast as an empty one.

On a real broker (RUNSTATE_BOOTSTRAP_SERVERS, else Docker, else the local launcher):
N runs are written to a changelog as a worker writes them (each run's history records
and snapshot, through `outcome_records`), then forgotten as the worker forgets them (the
`forget` outcome's tombstones). The worker's own restore (`restore_partitions`) is timed
into empty stores three times: with every record still there (before compaction), after
Kafka compacted the forgotten runs away, and from a changelog that never held a run (only
as many segment-rolling markers as the compacted one has left: like for like).
The changelog is set to compact at once (small segments, no dirty-ratio or tombstone
delay, and the broker's cleaner backoff lowered): the production settings compact the
same records, later.

    .venv/bin/python -m benchmarks.retention --runs 1000000

Prints one JSON object: the figures and the ratio forgotten / never held.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)
from pydantic import JsonValue
from rich.console import Console

from processor.broker.provide import provide_broker
from processor.engine import Commit, Forget, decide
from processor.engine.parse import parse_machine
from processor.kafka.config import KafkaSettings
from processor.kafka.partitioning import partition_for
from processor.kafka.readback import watermarks
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines, builtin_source
from processor.records.outputs import Headers, Source, outcome_records
from processor.runtimes.native.restore import restore_partitions
from processor.runtimes.native.store.partition import PartitionStore
from schemas.messages import Principal, Proposal

PARTITIONS = 3
KEPT = parse_machine(
    builtin_source("run_state").replace("name: run_state", "name: run_state\nretention_ms: 1")
)


def _templates() -> tuple[list[tuple[bytes, bytes | None, Headers]], list[tuple[bytes, None]]]:
    """The changelog records of one finished run (history + snapshots) and of its
    forgetting (tombstones), with the run id `RUN-ID` to replace."""
    machines = {**builtin_machines(), "run_state": KEPT}
    runtime = Principal(source="runtime", authority="runtime")
    snapshot, commits, now = None, [], 1_700_000_000_000
    steps: list[tuple[str, dict[str, JsonValue]]] = [
        ("create", {"machine": "run_state"}),
        ("start", {}),
        ("complete", {}),
    ]
    for n, (event, payload) in enumerate(steps):
        proposal = Proposal(proposal_id=f"p{n}", run_id="RUN-ID", event=event, payload=payload)
        commit = decide(machines, snapshot, proposal, runtime, now + n)
        assert isinstance(commit, Commit), commit
        commits.append(commit)
        snapshot = commit.snapshot
    last = Proposal(proposal_id="p3", run_id="RUN-ID", event="forget")
    forget = decide(machines, snapshot, last, runtime, now + 100)
    assert isinstance(forget, Forget), forget
    names = TopicNames.with_prefix("t.")
    source = Source("t.proposals", 0, 0, None, None, 0)
    lived = [
        (r.key or b"", r.value, r.headers or [])
        for c in commits
        for r in outcome_records(names, c, source)
        if r.topic == names.changelog
    ]
    gone = [
        (r.key or b"", None)
        for r in outcome_records(names, forget, source)
        if r.topic == names.changelog
    ]
    return lived, gone


def _write(bootstrap: str, topic: str, runs: int, console: Console) -> int:
    lived, gone = _templates()
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4"}
    )
    written = 0

    def send(key: bytes | None, value: bytes | None, headers: Headers, partition: int) -> None:
        while True:
            try:
                producer.produce(topic, value, key, partition=partition, headers=headers)
                return
            except BufferError:
                producer.poll(0.1)

    with console.status("writing the changelog") as status:
        for n in range(runs):
            run_id = f"r-{n}"
            partition = partition_for(run_id, PARTITIONS)
            for key, value, headers in lived:
                send(_named(key, run_id), _named(value, run_id), headers, partition)
            written += len(lived)
            if n % 50_000 == 0:
                status.update(f"writing the changelog: {n:,} of {runs:,} runs")
        for n in range(runs):
            run_id = f"r-{n}"
            partition = partition_for(run_id, PARTITIONS)
            for key, _ in gone:
                send(_named(key, run_id), None, [], partition)
            written += len(gone)
    assert producer.flush(300) == 0
    return written


def _named(raw: bytes | None, run_id: str) -> bytes | None:
    return None if raw is None else raw.replace(b"RUN-ID", run_id.encode())


def _restore(bootstrap: str, names: TopicNames, root: Path) -> tuple[float, int]:
    stores = {p: PartitionStore(root / str(p)) for p in range(PARTITIONS)}
    began = time.perf_counter()
    applied = restore_partitions(KafkaSettings(bootstrap), names, stores)
    seconds = time.perf_counter() - began
    for store in stores.values():
        store.close()
    return seconds, applied


def _records(bootstrap: str, topic: str) -> int:
    """Records a reader of `topic` gets now (offsets stay; compaction removes records)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-count"})
    try:
        total = 0
        for p in range(PARTITIONS):
            tp = TopicPartition(topic, p)
            low, high = watermarks(consumer, tp)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            while True:
                batch = consumer.consume(10_000, timeout=2.0)
                if not batch:
                    break
                total += sum(1 for m in batch if m.error() is None)
                if (batch[-1].offset() or 0) >= high - 1:
                    break
        return total
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="finished runs (1,000,000)")
    parser.add_argument("--wait", type=float, default=900.0, help="compaction timeout (s)")
    args = parser.parse_args()
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory() as tmp, provide_broker(Path(tmp) / "broker") as bootstrap:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        forgotten = TopicNames.with_prefix("ret.")
        empty = TopicNames.with_prefix("empty.")
        fast = {
            "segment.ms": "1000",
            "min.cleanable.dirty.ratio": "0.001",
            "delete.retention.ms": "0",
            "min.compaction.lag.ms": "0",
        }
        for names in (forgotten, empty):
            plans = plan_topics(names, PARTITIONS, 1)
            for plan in plans:
                if plan.role == "changelog":
                    plan.config.update(fast)
            create_topics(admin, plans)
        # The cleaner looks for work every 15 s by default: every second here.
        brokers = [
            ConfigResource(
                ConfigResource.Type.BROKER,
                str(node.id),
                incremental_configs=[
                    ConfigEntry(
                        "log.cleaner.backoff.ms",
                        "1000",
                        incremental_operation=AlterConfigOpType.SET,
                    )
                ],
            )
            for node in admin.describe_cluster().result().nodes
        ]
        for future in admin.incremental_alter_configs(brokers).values():
            future.result()
        written = _write(bootstrap, forgotten.changelog, args.runs, console)
        before_s, before_applied = _restore(bootstrap, forgotten, Path(tmp) / "before")
        console.print(f"restore before compaction: {before_s:.1f} s, {before_applied:,} records")
        # A record after segment.ms rolls the active segment, which the cleaner never
        # touches; then wait until the forgotten runs are gone.
        deadline = time.monotonic() + args.wait
        with console.status("waiting for compaction") as status:
            while True:
                time.sleep(2.0)
                roll = Producer({"bootstrap.servers": bootstrap})
                for p in range(PARTITIONS):
                    roll.produce(forgotten.changelog, None, b"\x00roll", partition=p)
                roll.flush(30)
                left = _records(bootstrap, forgotten.changelog)
                status.update(f"waiting for compaction: {left:,} of {written:,} records left")
                if left <= 10 * PARTITIONS or time.monotonic() > deadline:
                    break
        after_s, after_applied = _restore(bootstrap, forgotten, Path(tmp) / "after")
        # Like for like: a changelog that never held a run, with as many markers as
        # the compacted one has left (reading a non-empty partition has a fixed cost).
        marks = Producer({"bootstrap.servers": bootstrap})
        for n in range(left):
            marks.produce(empty.changelog, None, b"\x00roll", partition=n % PARTITIONS)
        marks.flush(30)
        empty_s, empty_applied = _restore(bootstrap, empty, Path(tmp) / "empty")
        result = {
            "runs": args.runs,
            "changelog_records_written": written,
            "records_left_after_compaction": left,
            "restore_s_before_compaction": round(before_s, 3),
            "records_restored_before_compaction": before_applied,
            "restore_s_after_compaction": round(after_s, 3),
            "records_restored_after_compaction": after_applied,
            "restore_s_never_held_runs": round(empty_s, 3),
            "records_restored_never_held_runs": empty_applied,
            "ratio_forgotten_to_never_held": round(after_s / max(empty_s, 1e-3), 2),
        }
        print(json.dumps(result, indent=2))
        if left > 10 * PARTITIONS:
            sys.exit(f"compaction did not finish within {args.wait:.0f} s")


if __name__ == "__main__":
    main()
