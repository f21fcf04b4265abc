"""When outcomes reach a reader, by the reader's clock: how long a fault kept answers
from the people waiting for them.

Record timestamps cannot say it: a worker stamps an outcome when it produces it into its
transaction, and a transaction held up by a broker fault commits (or is aborted and
decided again) seconds later. A read_committed consumer sees what an agent sees."""

import itertools
import threading
import time
import uuid
from collections import defaultdict

from confluent_kafka import Consumer, TopicPartition

from processor.config import KafkaSettings
from tests.integration.harness import Env


class Arrivals(threading.Thread):
    """Follows the outcome topics (read committed) from their current end and notes, per
    partition, the wall-clock time each record arrived."""

    def __init__(self, env: Env) -> None:
        super().__init__(daemon=True, name="arrivals")
        t = env.topics
        self.topics = [t.transitions, t.rejections, t.heartbeats, t.dlq]
        self.settings = KafkaSettings(env.bootstrap)
        self.times: dict[int, list[float]] = defaultdict(list)
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
                    if msg.error() is None:
                        self.times[msg.partition() or 0].append(time.time())
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
