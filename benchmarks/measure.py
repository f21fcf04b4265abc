"""What the benchmark measures, each against a contender running on a real broker.

Outcomes are counted by a read-committed consumer tailing the output topics: an outcome
counts when it is visible, so every contender pays for its commits."""

import bisect
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from benchmarks.contenders import Running, Setup
from benchmarks.records import RawRecord
from processor.kafka.config import KafkaSettings
from processor.runtimes.native.restore import restore_partitions
from processor.runtimes.native.store.partition import PartitionStore

#: Every outcome an awaited proposal gets (transition, rejection, the ceiling's copy of
#: the proposal) carries its proposal id as this JSON member, written compactly. A find
#: of fixed bytes costs a fraction of a regex search and no decoding.
PROPOSAL_ID = b'"proposal_id":"'
#: How often the reader asks for outcomes: the resolution of every visible time. A
#: consume call returns when its batch is full or this passed, so a shorter wait would
#: spin (a Python loop at a core's worth) and a longer one would add to the delays.
TICK_S = 0.002
#: How often the reader checks that the contender still runs (a waitpid per call).
ALIVE_EVERY_S = 0.5


def answer_id(value: bytes | None) -> bytes | None:
    """The proposal id an outcome answers, by a byte search (None: it carries none)."""
    if not value:
        return None
    at = value.find(PROPOSAL_ID)
    if at < 0:
        return None
    at += len(PROPOSAL_ID)
    end = value.find(b'"', at)
    return value[at:end] if end > 0 else None


def proposal_id(record: RawRecord) -> bytes:
    found = answer_id(record.value)
    if found is None:
        raise ValueError("benchmark input must carry proposal ids")
    return found


class CpuClock:
    """This process's CPU time (every thread: librdkafka's too) over a span of wall time,
    as a share of one core: what the instrument itself costs the machine."""

    def __init__(self) -> None:
        self.cpu, self.wall = time.process_time(), time.monotonic()

    def share(self) -> float:
        wall = time.monotonic() - self.wall
        return (time.process_time() - self.cpu) / wall if wall > 0 else 0.0


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
        self.visible: list[float] = []  # when each timed answer became visible
        self.first_seen: float | None = None  # when the first answer became visible
        self.answered = 0  # awaited proposals answered so far
        self.refused = 0  # ... of them by a rejection or a DLQ record
        self._transitions = setup.names.transitions
        self._alive_at = 0.0

    def expect(self, records: Sequence[RawRecord], sent_at: float = 0.0) -> None:
        for record in records:
            self.waiting[proposal_id(record)] = sent_at

    def take(self, wait: float, running: Running) -> None:
        """One consume call of at most `wait` seconds. Outcomes that answer no awaited
        proposal (the native worker's own deadline proposals) are ignored."""
        now = time.monotonic()
        if now - self._alive_at >= ALIVE_EVERY_S:
            self._alive_at = now
            running.check_alive()
        messages = self.consumer.consume(1000, max(wait, 0.001))
        if not messages:
            return
        seen = time.time()  # one clock read per batch: they became visible together
        waiting, delays, visible = self.waiting, self.delays, self.visible
        before = len(waiting)
        for msg in messages:
            sent_at = waiting.pop(answer_id(msg.value()), None)  # type: ignore[arg-type]
            if sent_at is None:
                continue
            if msg.topic() != self._transitions:
                self.refused += 1
            if sent_at:
                delays.append(seen - sent_at)
                visible.append(seen)
        if len(waiting) != before:
            self.answered += before - len(waiting)
            if self.first_seen is None:
                self.first_seen = seen

    def read_for(self, seconds: float, running: Running) -> None:
        """Take in the outcomes that become visible within `seconds`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.take(min(0.01, left), running)

    def until_answered(self, timeout: float, running: Running) -> bool:
        """Until every awaited proposal has its outcome (True) or `timeout` passed."""
        deadline = time.monotonic() + timeout
        while self.waiting and time.monotonic() < deadline:
            self.take(0.01, running)
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
        while True:
            try:
                producer.produce(
                    setup.names.proposals, record.value, record.key, headers=record.headers
                )
                break
            except BufferError:  # its queue holds 100,000 records: wait for some to go
                producer.poll(0.05)
        if n % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)


@dataclass
class Drain:
    rate: float  # proposals per second
    peak_mb: float  # the contender's peak resident memory
    bench_cpu: float  # this process's CPU while the contender drained, share of a core
    contender_cpu: float  # the contender's CPU over the same span, share of a core
    refused: float  # share of the input answered by a rejection or a DLQ record


def drain(
    setup: Setup,
    start: Callable[[Setup], Running],
    records: Sequence[RawRecord],
    partitions: int,
    *,
    started_first: bool = False,
) -> Drain:
    """Pre-load the topic, start the contender, and time it from its first outcome
    becoming visible (so start-up does not count) until all outcomes are visible. Visible
    times, not record timestamps: Quix Streams stamps outputs with the input's time.

    `started_first`: start the contender (and let it settle) before the load, for one
    of several processes whose group would otherwise rebalance mid-drain."""
    running = start(setup) if started_first else None
    load(setup, records)
    running = running or start(setup)
    tail = Tail(setup, partitions)
    tail.expect(records)
    try:
        deadline = time.monotonic() + 900
        while tail.first_seen is None and time.monotonic() < deadline:
            tail.take(0.01, running)  # start-up is not the drain: CPU counted from here
        clock, used, began = CpuClock(), running.cpu_seconds(), time.monotonic()
        if not tail.until_answered(max(0.0, deadline - time.monotonic()), running):
            raise TimeoutError(f"{len(tail.waiting)} proposals unanswered after 900 s")
        assert tail.first_seen is not None
        span = time.time() - tail.first_seen
        used = (running.cpu_seconds() - used) / (time.monotonic() - began)
        refused = tail.refused / len(records)
        return Drain(len(records) / span, running.memory_mb("VmHWM"), clock.share(), used, refused)
    finally:
        tail.close()
        running.stop()


@dataclass
class Latency:
    offered: float  # proposals per second offered
    achieved: float  # outcomes per second that became visible while the load was offered
    answered_ratio: float  # achieved ÷ offered
    p50_ms: float
    p99_ms: float
    missing: int  # outcomes not seen within `drain_s` of the feed's end
    bench_cpu: float  # this process (feed and reader) during the feed, share of a core
    fed: int  # proposals offered in the timed feed


def latency(
    setup: Setup,
    start: Callable[[Setup], Running],
    records: Sequence[RawRecord],
    rate: float,
    partitions: int,
    warmup: int,
    drain_s: float = 60.0,
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
        ids = [proposal_id(record) for record in timed]  # before the clock starts
        clock = CpuClock()
        began = time.monotonic()
        sends = feed(producer, setup.names.proposals, timed, ids, rate, tail, running)
        fed = time.monotonic() - began  # the send span: the flush below only waits
        cpu = clock.share()
        ended = time.time()
        producer.flush(30)
        tail.until_answered(drain_s, running)
        return _latency(tail, sends, fed, ended, cpu)
    finally:
        tail.close()
        running.stop()


def feed(
    producer: Producer,
    topic: str,
    records: Sequence[RawRecord],
    ids: Sequence[bytes],
    rate: float,
    tail: Tail,
    running: Running,
) -> list[tuple[float, int]]:
    """Send `records` at `rate` per second: each tick, every record due by then (sent
    together, each stamped with the send), then outcomes read until the next tick.
    Returns the sends: (wall time, records sent so far) per tick."""
    began, sent, total = time.monotonic(), 0, len(records)
    waiting, produce = tail.waiting, producer.produce
    sends: list[tuple[float, int]] = []
    while sent < total:
        due = min(total, int((time.monotonic() - began) * rate) + 1)
        if due > sent:
            now = time.time()
            for n in range(sent, due):
                record = records[n]
                waiting[ids[n]] = now
                produce(topic, record.value, record.key, headers=record.headers)
            producer.poll(0)
            sent = due
            sends.append((now, sent))
        next_send = began + sent / rate
        tail.take(min(TICK_S, max(0.0, next_send - time.monotonic())), running)
    return sends


def _sent_by(sends: list[tuple[float, int]], at: float) -> int:
    """Records sent by wall time `at`."""
    n = bisect.bisect_right(sends, (at, float("inf")))
    return sends[n - 1][1] if n else 0


def _latency(
    tail: Tail, sends: list[tuple[float, int]], fed: float, ended: float, cpu: float
) -> Latency:
    """The figures of a timed feed (`sends`) over `fed` seconds ending at `ended` (wall
    clock). Answered per second: the outcomes that became visible within the feed once
    its first second (a tenth, when shorter) or its median delay, the longer, had gone.
    Answered ÷ offered sets that against the rate of what was sent over the same span
    moved back by the median delay: one if the contender keeps up, whatever its delay
    (no window edge cuts a commit's burst of answers off from its sends), its own rate
    ÷ the offered one if it falls behind."""
    count = sends[-1][1] if sends else 0
    offered, began = count / fed, ended - fed
    ordered = sorted(tail.delays)
    median = statistics.median(ordered) if ordered else 0.0
    start = began + max(min(1.0, fed / 10), median)
    span = ended - start
    if span < 0.5:  # answers come later than the feed lasts: its whole span instead
        start, span = began + min(1.0, fed / 10), fed - min(1.0, fed / 10)
    shown = sum(1 for t in tail.visible if start <= t <= ended)
    achieved = shown / span
    sent = _sent_by(sends, ended - median) - _sent_by(sends, start - median)
    offered_then = sent / span if sent and start - median >= began else offered
    return Latency(
        offered=offered,
        achieved=achieved,
        answered_ratio=achieved / offered_then,
        p50_ms=1000 * median if ordered else float("nan"),
        p99_ms=1000 * ordered[int(0.99 * (len(ordered) - 1))] if ordered else float("nan"),
        missing=len(tail.waiting),
        bench_cpu=cpu,
        fed=count,
    )


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
