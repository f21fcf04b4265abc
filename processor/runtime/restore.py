"""Bring partition stores up to date from the changelog: the runs' snapshots, their
history (and so every proposal id they committed) and their fired timers. A forgotten
run's tombstones, once compacted, leave nothing of it to read.

Each store remembers the next offset of the changelog it reflects; restore reads from
there to the end of what is committed (read_committed: transaction markers and open
transactions of a dead worker are never waited for) and applies the records in
batches, offsets included, so an interrupted restore resumes where it stopped.
"""

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from processor.config import KafkaSettings
from processor.intake import header_value
from processor.outputs import INDEX_HEADER, REVISION_HEADER
from processor.readback import watermarks
from processor.runtime.store import ChangelogRecord, PartitionStore
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
    cancelled: Callable[[], bool] = lambda: False,
) -> int:
    """Catch `stores` (input partition -> store) up; returns the records applied.
    `cancelled` is asked between batches: when it says so, restore stops (what it
    applied is kept, with its offsets, and the next restore resumes from there)."""
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
            topic = topics.changelog
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
        records: dict[int, list[ChangelogRecord]] = defaultdict(list)
        offsets: dict[int, dict[str, int]] = defaultdict(dict)
        pending = 0
        deadline = time.monotonic() + timeout_s

        def apply() -> None:
            nonlocal pending
            for partition in set(records) | set(offsets):
                stores[partition].restore(records.pop(partition, []), offsets.pop(partition, {}))
            pending = 0

        while remaining and not cancelled():
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
                # A snapshot's index header, or a history record's revision header.
                header = _header(msg, INDEX_HEADER) or _header(msg, REVISION_HEADER)
                records[partition].append((msg.key() or b"", msg.value(), header))
                offsets[partition][topic] = offset + 1
                applied += 1
                pending += 1
            if pending >= _BATCH:
                apply()
                if progress is not None:
                    progress(applied)
        apply()
        if cancelled():
            return applied
        # Where only transaction markers followed, remember the end so the next
        # restore starts there.
        for tp in consumer.position(wanted):
            if tp.offset >= 0:
                store = stores[tp.partition]
                current = store.offset(tp.topic)
                if current is None or current < tp.offset:
                    store.restore([], {tp.topic: tp.offset})
        log.info("restored %d records into partitions %s", applied, sorted(stores))
        return applied
    finally:
        consumer.close()


def _header(msg: Message, name: str) -> bytes | None:
    value = header_value(msg.headers(), name)
    return value if isinstance(value, bytes) else None


class RestoreJob:
    """A restore beside the worker's loop: the loop keeps polling (so the worker keeps
    its place in the group, however long the restore takes: max.poll.interval.ms) while
    the partitions it restores stay paused."""

    def __init__(
        self,
        settings: KafkaSettings,
        topics: TopicNames,
        stores: dict[int, PartitionStore],
    ) -> None:
        self.stores = stores
        self.applied = 0
        self.error: BaseException | None = None
        self._cancel = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(settings, topics), name="runstate-restore", daemon=True
        )
        self._thread.start()

    def _run(self, settings: KafkaSettings, topics: TopicNames) -> None:
        try:
            self.applied = restore_partitions(
                settings, topics, self.stores, cancelled=self._cancel.is_set
            )
            for store in self.stores.values():
                store.state_counts()  # counted here, not in the first scrape
        except BaseException as exc:  # handed to the loop, which raises it
            self.error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def cancel(self) -> None:
        """Stop between batches and wait for it (its stores may then be closed)."""
        self._cancel.set()
        self._thread.join()
