"""End-to-end drain rate on a real broker: the native worker against the ceiling.

The same pre-loaded proposals topic (the seed machines' workload, about 10 % refused)
is drained by each contender with exactly-once, and the rate is proposals divided by
the time from the first outcome's record timestamp (when the contender produced it) to
the moment all of them are visible to a read-committed consumer tailing the outputs, so
process start-up does not count and every checkpoint does.
  ceiling: confluent-kafka consume -> produce passthrough in transactions, no state,
           the same checkpoint cadence as the worker (100 ms or 1,000 records);
  native:  `runstate worker`, one process.
A first slice of issue 8 (the other contenders, latency, restore and memory are not
here yet). Usage: python -m benchmarks.pipeline [--runs 2000 --proposals 20000 --repeats 3]
"""

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.table import Table

from processor.broker.provide import provide_broker
from processor.topics import TopicNames, create_topics, plan_topics
from tests.integration.harness import WorkerProcess, make_env, send, workload

PARTITIONS = 3


def outcome_span(bootstrap: str, topics: list[str], expected: int, timeout: float) -> float:
    """Seconds from the first outcome's record timestamp until `expected` outcomes are
    visible to a read-committed consumer (tailing from offset 0)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "log_level": 3,
        }
    )
    parts = [
        TopicPartition(topic, p, OFFSET_BEGINNING) for topic in topics for p in range(PARTITIONS)
    ]
    consumer.assign(parts)
    seen, first_ms = 0, None
    deadline = time.monotonic() + timeout
    try:
        while seen < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{seen} of {expected} outcomes after {timeout:.0f}s")
            for msg in consumer.consume(1000, 0.01):
                if msg.error():
                    continue
                seen += 1
                stamp = msg.timestamp()[1]
                first_ms = stamp if first_ms is None else min(first_ms, stamp)
        assert first_ms is not None
        return time.time() - first_ms / 1000
    finally:
        consumer.close()


def ceiling(bootstrap: str, names: TopicNames, expected: int) -> None:
    """Transactional passthrough until `expected` records were committed."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"ceiling-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"ceiling-{uuid.uuid4().hex[:6]}"}
    )
    producer.init_transactions(30)
    consumer.subscribe([names.proposals])
    done, pending, started = 0, {}, time.monotonic()
    producer.begin_transaction()
    while done < expected:
        for msg in consumer.consume(500, 0.05):
            if msg.error():
                continue
            producer.produce(names.transitions, msg.value(), msg.key(), partition=msg.partition())
            pending[msg.partition()] = msg.offset() + 1
        if pending and time.monotonic() - started >= 0.1:
            offsets = [TopicPartition(names.proposals, p, o) for p, o in pending.items()]
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())
            producer.commit_transaction()
            done = sum(o for o in pending.values())
            producer.begin_transaction()
            started = time.monotonic()
    producer.abort_transaction()
    consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2_000)
    parser.add_argument("--proposals", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    rates: dict[str, list[float]] = {"ceiling": [], "native": []}
    plan = workload(runs=args.runs, proposals=args.proposals, seed=8)
    with tempfile.TemporaryDirectory() as tmp, provide_broker(Path(tmp) / "broker") as bootstrap:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for repeat in range(args.repeats):
            for contender in rates:
                names = TopicNames.with_prefix(f"b-{uuid.uuid4().hex[:8]}.")
                create_topics(admin, plan_topics(names, PARTITIONS, 1))
                where = Path(tmp) / f"{contender}-{repeat}"
                where.mkdir()
                env = make_env(bootstrap, names, where)
                with console.status(f"{contender}, repeat {repeat + 1}: loading"):
                    send(env, plan)
                with console.status(f"{contender}, repeat {repeat + 1}: draining"):
                    if contender == "ceiling":
                        passthrough = threading.Thread(
                            target=ceiling, args=(bootstrap, names, len(plan)), daemon=True
                        )
                        passthrough.start()
                        topics = [names.transitions]
                    else:
                        worker = WorkerProcess(env, env.tmp / "w")
                        topics = [names.transitions, names.rejections, names.dlq]
                    span = outcome_span(bootstrap, topics, len(plan), timeout=600)
                    if contender == "native":
                        worker.terminate()
                rates[contender].append(len(plan) / span)
                console.print(f"{contender}: {len(plan) / span:,.0f} proposals/s")
    table = Table(title=f"drain rate, {len(plan):,} proposals, {args.repeats} repeats")
    for column in ("contender", "min /s", "median /s", "max /s", "native / it"):
        table.add_column(column, justify="right")
    native = statistics.median(rates["native"])
    for name, values in rates.items():
        table.add_row(
            name,
            f"{min(values):,.0f}",
            f"{statistics.median(values):,.0f}",
            f"{max(values):,.0f}",
            f"{native / statistics.median(values):.2f}",
        )
    console.print(table)


if __name__ == "__main__":
    main()
