"""Bring partition stores up to date from the changelog and transitions topics.

Each store remembers the next offset of both topics it reflects; restore reads from
there to the end of what is committed (read_committed: transaction markers and open
transactions of a dead worker are never waited for) and applies the records in
batches, offsets included, so an interrupted restore resumes where it stopped.
"""

import logging
import time
from collections import defaultdict
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from processor.config import KafkaSettings
from processor.readback import watermarks
from processor.runtime.store import PartitionStore
from processor.topics import TopicNames

log = logging.getLogger("runstate.restore")
_BATCH = 5_000


def restore_partitions(
    settings: KafkaSettings,
    topics: TopicNames,
    stores: dict[int, PartitionStore],
    *,
    timeout_s: float = 600.0,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Catch `stores` (input partition -> store) up; returns the records applied."""
    consumer = Consumer(
        settings.client(
            {
                "group.id": "runstate-restore",  # never joins: assign() only, no commits
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
    )
    try:
        wanted: list[TopicPartition] = []
        for partition, store in stores.items():
            for topic in (topics.changelog, topics.transitions):
                start = store.offset(topic)
                low, high = watermarks(consumer, TopicPartition(topic, partition))
                begin = low if start is None else max(start, low)
                if begin < high:
                    wanted.append(TopicPartition(topic, partition, begin or OFFSET_BEGINNING))
        if not wanted:
            return 0
        consumer.assign(wanted)
        remaining = {(tp.topic, tp.partition) for tp in wanted}
        applied = 0
        snapshots: dict[int, list[tuple[bytes, bytes | None]]] = defaultdict(list)
        transitions: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
        offsets: dict[int, dict[str, int]] = defaultdict(dict)
        pending = 0
        deadline = time.monotonic() + timeout_s

        def apply() -> None:
            nonlocal pending
            for partition in set(snapshots) | set(transitions) | set(offsets):
                stores[partition].restore(
                    snapshots.pop(partition, []),
                    transitions.pop(partition, []),
                    offsets.pop(partition, {}),
                )
            pending = 0

        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"restore did not reach the end of {sorted(remaining)} in {timeout_s:.0f}s"
                )
            for msg in consumer.consume(num_messages=1_000, timeout=0.5):
                err = msg.error()
                key = (msg.topic(), msg.partition())
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        remaining.discard(key)
                        continue
                    raise KafkaException(err)
                topic, partition, offset = key[0] or "", key[1] or 0, msg.offset() or 0
                if topic == topics.changelog:
                    snapshots[partition].append((msg.key() or b"", msg.value()))
                else:
                    transitions[partition].append((msg.key() or b"", msg.value() or b"{}"))
                offsets[partition][topic] = offset + 1
                applied += 1
                pending += 1
            if pending >= _BATCH:
                apply()
                if progress is not None:
                    progress(applied)
        apply()
        # Where only transaction markers followed, remember the end so the next
        # restore starts there.
        for tp in consumer.position(wanted):
            if tp.offset >= 0:
                store = stores[tp.partition]
                current = store.offset(tp.topic)
                if current is None or current < tp.offset:
                    store.restore([], [], {tp.topic: tp.offset})
        log.info("restored %d records into partitions %s", applied, sorted(stores))
        return applied
    finally:
        consumer.close()
