"""When outcomes reach a reader, by the reader's clock: how long a fault kept answers
from the people waiting for them.

Record timestamps cannot say it: a worker stamps an outcome when it produces it into its
transaction, and a transaction held up by a broker fault commits (or is aborted and
decided again) seconds later. A read_committed consumer sees what an agent sees."""

import itertools
import json
import threading
import time
import uuid
from collections import defaultdict

from confluent_kafka import Consumer, TopicPartition

from processor.kafka.config import KafkaSettings
from tests.integration.harness import Env


class Arrivals(threading.Thread):
    """Follows the outcome topics (read committed) from their current end and notes, per
    partition, the wall-clock time each record arrived."""

    def __init__(self, env: Env, latencies: bool = False) -> None:
        super().__init__(daemon=True, name="arrivals")
        t = env.topics
        self.topics = [t.transitions, t.rejections, t.heartbeats, t.dlq]
        self.settings = KafkaSettings(env.bootstrap)
        self.times: dict[int, list[float]] = defaultdict(list)
        #: With `latencies`: per transition or rejection read, seconds from its proposal's
        #: append to the proposals topic (the outcome's at_ms) to its arrival here.
        self.latencies: list[float] | None = [] if latencies else None
        self._timed = {t.transitions, t.rejections}
        self._stopping = threading.Event()
        self._reading = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        consumer = Consumer(
            self.settings.client(
                {
                    "group.id": f"arrivals-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    # A reader that notices a lost leader late adds its own delay.
                    "topic.metadata.refresh.interval.ms": 1000,
                    "log_level": 3,
                }
            )
        )
        try:
            assignment = []
            for topic in self.topics:
                meta = consumer.list_topics(topic, timeout=30).topics[topic]
                assignment += [TopicPartition(topic, p, -1) for p in meta.partitions]  # end
            consumer.assign(assignment)
            self._reading.set()
            while not self._stopping.is_set():
                for msg in consumer.consume(num_messages=1000, timeout=0.2):
                    if msg.error() is not None:
                        continue
                    now = time.time()
                    self.times[msg.partition() or 0].append(now)
                    if self.latencies is not None and msg.topic() in self._timed:
                        at_ms = json.loads(msg.value() or b"{}").get("at_ms")
                        if isinstance(at_ms, int):
                            self.latencies.append(now - at_ms / 1000)
        except BaseException as exc:  # reported by the scenario
            self.error = exc
        finally:
            self._reading.set()
            consumer.close()

    def begin(self) -> None:
        self.start()
        self._reading.wait(60)

    def end(self) -> None:
        self._stopping.set()
        if self.ident is not None:
            self.join(30)


def recovery_seconds(
    fault_times: list[float], times: dict[int, list[float]], until: float
) -> list[float]:
    """Per fault, the longest any partition went without an answer, over the stalls that
    began between the fault and the next fault (or `until`, shortly before the feed
    ended: answers stop then for want of proposals): the wait from the fault to the
    first answer, or a later stall (a leader moved, a rebalance), whichever is longer."""
    out = []
    bounds = [*sorted(fault_times), until]
    for at, end in itertools.pairwise(bounds):
        worst = 0.0
        for arrived in times.values():
            after = [t for t in arrived if t > at]
            if not after:
                worst = max(worst, max(end, at) - at)
                continue
            seq = [at, *after]
            gaps = [b - a for a, b in itertools.pairwise(seq) if a == at or a < end]
            worst = max(worst, max(gaps))
        out.append(round(worst, 2))
    return out


def first_answers_after(returns: list[float], times: dict[int, list[float]]) -> list[float]:
    """Per return (a broker answering again), how long until every partition had
    answered again: the latest of the partitions' first answers after it. A partition
    with no answer after it is left out here; its stall shows in recovery_seconds."""
    out = []
    for back in returns:
        firsts = [min((t for t in arrived if t > back), default=None) for arrived in times.values()]
        waits = [t - back for t in firsts if t is not None]
        out.append(round(max(waits, default=float("nan")), 2))
    return out
