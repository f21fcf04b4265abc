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

from processor.kafka.config import KafkaSettings
from processor.kafka.readback import watermarks
from processor.kafka.topics import TopicNames
from processor.records.changelog_keys import INDEX_HEADER, REVISION_HEADER
from processor.records.outputs import Headers
from processor.runtimes.native.heap import give_back
from processor.runtimes.native.store.changelog import ChangelogRecord
from processor.runtimes.native.store.partition import PartitionStore

log = logging.getLogger("runstate.restore")
#: Records per store write and per consume call (were 5,000 and 1,000): fewer, larger
#: RocksDB batches and fewer Python calls.
_BATCH = 20_000
_INDEX_HEADERS = (INDEX_HEADER, REVISION_HEADER)


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
    consumer = bulk_consumer(settings)
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
        last: dict[int, Message] = {}  # per partition, the last record read
        pending = 0
        deadline = time.monotonic() + timeout_s

        def apply() -> None:
            nonlocal pending
            for partition, msg in last.items():
                offsets = {msg.topic() or "": (msg.offset() or 0) + 1}
                stores[partition].restore(records.pop(partition, []), offsets)
            last.clear()
            pending = 0

        while remaining and not cancelled():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"restore did not reach the end of {sorted(remaining)} in {timeout_s:.0f}s"
                )
            for msg in consumer.consume(num_messages=_BATCH, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        remaining.discard((msg.topic(), msg.partition()))
                        continue
                    raise KafkaException(err)
                partition = msg.partition() or 0
                # A snapshot's index header, or a history record's revision header: the
                # only header of the worker's records, so looked at first (a call per
                # record was ~10% of a restore's profile).
                headers = msg.headers()
                if isinstance(headers, list) and len(headers) == 1:
                    name, value = headers[0]
                    header = value if name in _INDEX_HEADERS and isinstance(value, bytes) else None
                else:
                    header = index_header(headers)
                records[partition].append((msg.key() or b"", msg.value(), header))
                last[partition] = msg
                pending += 1
            if pending >= _BATCH:
                applied += pending
                apply()
                if progress is not None:
                    progress(applied)
        applied += pending
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
        # Restore writes skip the write-ahead log: on disk before the worker writes.
        for store in stores.values():
            store.flush_restored()


def bulk_consumer(settings: KafkaSettings) -> Consumer:
    """A read-committed consumer for reading partitions to their end (assign() only)."""
    return Consumer(
        settings.client(
            {
                "group.id": "runstate-restore",  # never joins: assign() only, no commits
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            },
            # Large fetches and a deep local queue: with librdkafka's defaults (1 MB per
            # partition, 64 MB queued) a bare reader of a 1M-run changelog read 143k
            # records/s on the 2-core benchmark machine, with large fetches 354k (same
            # minute; that one queued up to 1 GB: 256 MB bounds what a restore holds).
            defaults={
                "fetch.max.bytes": 100 << 20,
                "max.partition.fetch.bytes": 32 << 20,
                "queued.max.messages.kbytes": 256 << 10,
                "queued.min.messages": 1_000_000,
            },
        )
    )


def index_header(headers: Headers | dict[str, str | bytes | None] | None) -> bytes | None:
    """The value of a record's INDEX_HEADER or REVISION_HEADER, if it has either (a
    consumer's record has its headers as a list)."""
    for name, value in headers if isinstance(headers, list) else ():
        if name in _INDEX_HEADERS and isinstance(value, bytes):
            return value
    return None


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
        finally:
            give_back()  # the consumer's prefetched changelog, freed (heap.py)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def cancel(self) -> None:
        """Stop between batches and wait for it (its stores may then be closed)."""
        self._cancel.set()
        self._thread.join()
