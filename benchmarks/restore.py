"""Restore speed alone: a changelog filled with the records a worker writes for N created
runs (real Commits through `outcome_records`, in transactions), then timed twice on the
same broker: a bare read-committed consumer reading it to its end with no store (the
read ceiling), and `restore_partitions` into empty stores. Prints JSON.

Usage: python -m benchmarks.restore [--runs 1000000] [--bootstrap HOST:PORT]
       [--prefix PREFIX (reuse the topics a previous run filled)] [--repeats 1]
"""

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from processor.broker.provide import provide_broker
from processor.engine import Commit, decide
from processor.kafka.config import KafkaSettings
from processor.kafka.partitioning import partition_for
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines
from processor.records.outputs import Source, outcome_records
from processor.runtimes.native.restore import restore_partitions
from processor.runtimes.native.store.partition import PartitionStore
from schemas import Principal, Proposal

RUNTIME = Principal(source="runtime", authority="runtime")
_PER_TRANSACTION = 5_000


def fill(bootstrap: str, names: TopicNames, runs: int, partitions: int) -> None:
    """The changelog records of `runs` creates, as the benchmark's worker writes them."""
    machines = builtin_machines()
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"fill-{uuid.uuid4().hex[:8]}",
            "linger.ms": 5,
            "compression.type": "lz4",
        }
    )
    producer.init_transactions()
    producer.begin_transaction()
    now = 1_800_000_000_000
    for n in range(runs):
        run_id = f"m-{n}"
        proposal = Proposal(
            run_id=run_id, event="create", payload={"machine": "task_lifecycle"}, proposal_id=run_id
        )
        commit = decide(machines, None, proposal, RUNTIME, now + n)
        assert isinstance(commit, Commit)
        source = Source(names.proposals, 0, n, run_id.encode(), b"", now + n)
        partition = partition_for(run_id, partitions)
        for record in outcome_records(names, commit, source):
            if record.topic != names.changelog:
                continue
            while True:
                try:
                    producer.produce(
                        record.topic,
                        key=record.key,
                        value=record.value,
                        headers=record.headers,
                        partition=partition,
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
        if (n + 1) % _PER_TRANSACTION == 0:
            producer.commit_transaction()
            producer.begin_transaction()
    producer.commit_transaction()


def read_ceiling(bootstrap: str, names: TopicNames, partitions: int) -> tuple[int, float]:
    """(records, seconds) of a bare read-committed consumer with bulk fetch settings,
    reading every partition to its end and touching each record's key, value and headers,
    with no store. Its own settings, not restore's: a fixed peer across versions."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "restore-ceiling",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "fetch.max.bytes": 100 << 20,
            "max.partition.fetch.bytes": 32 << 20,
            "queued.max.messages.kbytes": 256 << 10,
            "queued.min.messages": 1_000_000,
        }
    )
    try:
        consumer.assign([TopicPartition(names.changelog, p, 0) for p in range(partitions)])
        remaining, records = set(range(partitions)), 0
        began = time.monotonic()
        while remaining:
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        remaining.discard(msg.partition() or 0)
                    continue
                msg.key(), msg.value(), msg.headers()
                records += 1
        return records, time.monotonic() - began
    finally:
        consumer.close()


def restore_once(bootstrap: str, names: TopicNames, partitions: int, tmp: Path) -> dict[str, Any]:
    stores = {
        p: PartitionStore(tmp / f"r-{uuid.uuid4().hex[:6]}" / str(p)) for p in range(partitions)
    }
    began = time.monotonic()
    applied = restore_partitions(KafkaSettings(bootstrap), names, stores)
    seconds = time.monotonic() - began
    runs = sum(sum(s.state_counts().values()) for s in stores.values())
    for store in stores.values():
        store.close()
    return {"records": applied, "runs": runs, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--bootstrap")
    parser.add_argument("--prefix", help="Topics a previous run filled (skips the fill).")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.bootstrap:
            run(args, args.bootstrap, Path(tmp))
        else:
            with provide_broker(Path(tmp) / "broker") as bootstrap:
                run(args, bootstrap, Path(tmp))


def run(args: argparse.Namespace, bootstrap: str, tmp: Path) -> None:
    out: dict[str, Any] = {"runs": args.runs, "partitions": args.partitions}
    prefix = args.prefix or f"r-{uuid.uuid4().hex[:8]}."
    names = TopicNames.with_prefix(prefix)
    if args.prefix is None:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
        create_topics(admin, plan_topics(names, args.partitions, 1))
        began = time.monotonic()
        fill(bootstrap, names, args.runs, args.partitions)
        out["fill_seconds"] = round(time.monotonic() - began, 1)
    out["prefix"] = prefix
    rows = []
    for _ in range(args.repeats):
        records, seconds = read_ceiling(bootstrap, names, args.partitions)
        restored = restore_once(bootstrap, names, args.partitions, tmp)
        ceiling = records / seconds
        rate = restored["records"] / restored["seconds"]
        rows.append(
            {
                "ceiling_records_per_s": round(ceiling),
                "restore_records_per_s": round(rate),
                "restore_runs_per_s": round(restored["runs"] / restored["seconds"]),
                "restore_seconds": round(restored["seconds"], 2),
                "runs_restored": restored["runs"],
                "restore_over_ceiling": round(rate / ceiling, 3),
            }
        )
    out["repeats"] = rows
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
