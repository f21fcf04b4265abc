"""What the benchmark measures, each against a contender running on a real broker.

Outcomes are counted by a read-committed consumer tailing the output topics: an outcome
counts when it is visible, so every contender pays for its commits."""

import re
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from benchmarks.contenders import Running, Setup
from benchmarks.records import RawRecord
from processor.config import KafkaSettings
from processor.runtime.restore import restore_partitions
from processor.runtime.store import PartitionStore

PROPOSAL_ID = re.compile(rb'"proposal_id":"([^"]+)"')


def proposal_id(record: RawRecord) -> bytes:
    match = PROPOSAL_ID.search(record.value or b"")
    if match is None:
        raise ValueError("benchmark input must carry proposal ids")
    return match.group(1)


class Tail:
    """A read-committed consumer over the output topics, from their beginning."""

    def __init__(self, setup: Setup, partitions: int) -> None:
        names = setup.names
        self.consumer = Consumer(
            {
                "bootstrap.servers": setup.bootstrap,
                "group.id": f"bench-tail-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                # Ask often: a long-poll fetch must not add its wait to the latencies.
                "fetch.wait.max.ms": 10,
                "log_level": 3,
            }
        )
        self.consumer.assign(
            [
                TopicPartition(topic, p, OFFSET_BEGINNING)
                for topic in (names.transitions, names.rejections, names.dlq)
                for p in range(partitions)
            ]
        )
        # Proposal id -> when it was sent (0.0: not timed); removed once answered.
        self.waiting: dict[bytes, float] = {}
        self.delays: list[float] = []
        self.first_seen: float | None = None  # when the first answer became visible

    def expect(self, records: Sequence[RawRecord], sent_at: float = 0.0) -> None:
        for record in records:
            self.waiting[proposal_id(record)] = sent_at

    def read_for(self, seconds: float, running: Running) -> None:
        """Take in the outcomes that become visible within `seconds`. Outcomes that answer
        no awaited proposal (the native worker's own deadline proposals) are ignored."""
        deadline = time.monotonic() + seconds
        while True:
            running.check_alive()
            wait = min(0.05, deadline - time.monotonic())
            if wait <= 0:
                return
            for msg in self.consumer.consume(1000, wait):
                if msg.error():
                    continue
                match = PROPOSAL_ID.search(msg.value() or b"")
                sent_at = None if match is None else self.waiting.pop(match.group(1), None)
                if sent_at is None:
                    continue
                now = time.time()
                if self.first_seen is None:
                    self.first_seen = now
                if sent_at:
                    self.delays.append(now - sent_at)

    def until_answered(self, timeout: float, running: Running) -> bool:
        """Until every awaited proposal has its outcome (True) or `timeout` passed."""
        deadline = time.monotonic() + timeout
        while self.waiting and time.monotonic() < deadline:
            self.read_for(min(0.5, deadline - time.monotonic()), running)
        return not self.waiting

    def close(self) -> None:
        self.consumer.close()


def load(setup: Setup, records: Sequence[RawRecord]) -> None:
    """Produce `records` (one producer: each run's order kept) and wait until written."""
    producer = Producer(
        {
            "bootstrap.servers": setup.bootstrap,
            "linger.ms": 20,
            "log_level": 3,
            "partitioner": "murmur2_random",  # where the runs live (else wrong_partition)
        }
    )
    for n, record in enumerate(records):
        producer.produce(setup.names.proposals, record.value, record.key, headers=record.headers)
        if n % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)


@dataclass
class Drain:
    rate: float  # proposals per second
    peak_mb: float  # the contender's peak resident memory


def drain(
    setup: Setup, start: Callable[[Setup], Running], records: Sequence[RawRecord], partitions: int
) -> Drain:
    """Pre-load the topic, start the contender, and time it from its first outcome
    becoming visible (so start-up does not count) until all outcomes are visible. Visible
    times, not record timestamps: Quix Streams stamps outputs with the input's time."""
    load(setup, records)
    running = start(setup)
    tail = Tail(setup, partitions)
    tail.expect(records)
    try:
        if not tail.until_answered(900, running):
            raise TimeoutError(f"{len(tail.waiting)} proposals unanswered after 900 s")
        assert tail.first_seen is not None
        span = time.time() - tail.first_seen
        return Drain(len(records) / span, running.memory_mb("VmHWM"))
    finally:
        tail.close()
        running.stop()


@dataclass
class Latency:
    offered: float  # proposals per second offered
    achieved: float  # outcomes per second seen while offered
    p50_ms: float
    p99_ms: float
    missing: int  # outcomes not seen within 60 s of the feed's end


def latency(
    setup: Setup,
    start: Callable[[Setup], Running],
    records: Sequence[RawRecord],
    rate: float,
    partitions: int,
    warmup: int,
) -> Latency:
    """Offer `records` at `rate` per second from one producer and take each outcome's
    delay from the proposal's send to its visibility; the first `warmup` are sent (and
    answered) before timing starts, so start-up and restore do not count."""
    running = start(setup)
    tail = Tail(setup, partitions)
    producer = Producer(
        {
            "bootstrap.servers": setup.bootstrap,
            "linger.ms": 0,
            "log_level": 3,
            "partitioner": "murmur2_random",
        }
    )
    try:
        tail.expect(records[:warmup])
        load(setup, records[:warmup])
        if not tail.until_answered(300, running):
            raise TimeoutError("the contender did not answer the warm-up within 300 s")
        timed = records[warmup:]
        began = time.monotonic()
        for n, record in enumerate(timed):
            ahead = n / rate - (time.monotonic() - began)
            if ahead > 0:
                tail.read_for(ahead, running)  # take in outcomes until the next send
            tail.waiting[proposal_id(record)] = time.time()
            producer.produce(
                setup.names.proposals, record.value, record.key, headers=record.headers
            )
            producer.poll(0)
        producer.flush(30)
        fed = time.monotonic() - began
        tail.until_answered(60, running)
        answered = time.monotonic() - began
        ordered = sorted(tail.delays)
        return Latency(
            offered=len(timed) / fed,
            achieved=len(ordered) / answered,
            p50_ms=1000 * statistics.median(ordered) if ordered else float("nan"),
            p99_ms=1000 * ordered[int(0.99 * (len(ordered) - 1))] if ordered else float("nan"),
            missing=len(tail.waiting),
        )
    finally:
        tail.close()
        running.stop()


@dataclass
class Growth:
    resident_mb: dict[int, float]  # runs -> the worker's resident memory
    restore_runs_per_s: float


def growth_and_restore(
    setup: Setup,
    start: Callable[[Setup], Running],
    batches: Sequence[tuple[int, Sequence[RawRecord]]],
    partitions: int,
) -> Growth:
    """Feed `batches` (runs in all after it, its create proposals) to one worker and read
    its resident memory after each is answered; then time a restore of every partition
    from the changelog into empty stores (the worker's own restore) in runs per second."""
    running = start(setup)
    tail = Tail(setup, partitions)
    resident: dict[int, float] = {}
    try:
        for runs, records in batches:
            tail.expect(records)
            load(setup, records)
            if not tail.until_answered(1800, running):
                raise TimeoutError(f"{runs} runs not all answered within 1800 s")
            time.sleep(1.0)  # let the checkpoint after the last batch settle
            resident[runs] = running.memory_mb()
    finally:
        tail.close()
        running.stop()
    runs = max(resident)
    stores = {p: PartitionStore(setup.workdir / "restore" / str(p)) for p in range(partitions)}
    began = time.monotonic()
    applied = restore_partitions(KafkaSettings(setup.bootstrap), setup.names, stores)
    seconds = time.monotonic() - began
    if applied < runs:
        raise RuntimeError(f"restore applied {applied} records for {runs} runs")
    for store in stores.values():
        store.close()
    return Growth(resident, runs / seconds)
