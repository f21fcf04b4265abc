"""Read topics back from offset 0 to their current end (read_committed by default).

Used where the published record is the truth: the demo's accounting, tests, replay.
`follow` reads on past the end, as records are appended (`runstate tail`).
"""

import time
import uuid
from collections.abc import Iterator
from typing import Self

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from processor.history.audit import Record
from processor.kafka.config import KafkaSettings
from processor.records.intake import TimestampType

# The partition's leader is not known yet: right after the topic was created, or while
# a restarted broker is taking its partitions back.
_ELECTING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
}


def watermarks(consumer: Consumer, tp: TopicPartition, timeout: float = 30.0) -> tuple[int, int]:
    """The partition's (low, high) offsets, waiting up to `timeout` for a leader."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            left = max(1.0, deadline - time.monotonic())  # the whole wait stays `timeout`
            low, high = consumer.get_watermark_offsets(tp, timeout=left)
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0]
            waiting = error.code() in _ELECTING or error.retriable()
            if not waiting or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _reader(settings: KafkaSettings, committed: bool) -> Consumer:
    """A consumer that never joins a group or commits: assign() and read to the end."""
    return Consumer(
        settings.client(
            {
                "group.id": f"runstate-reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed" if committed else "read_uncommitted",
            }
        )
    )


def read_topics(
    settings: KafkaSettings,
    topics: list[str],
    *,
    committed: bool = True,
    timeout: float = 120.0,
) -> list[Message]:
    """Every record of `topics` up to the end, in partition order per partition."""
    consumer = _reader(settings, committed)
    try:
        assignment = []
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=30).topics[topic]
            for p in meta.partitions:
                low, high = watermarks(consumer, TopicPartition(topic, p))
                if high > low:
                    assignment.append(TopicPartition(topic, p, low))
        if not assignment:
            return []
        consumer.assign(assignment)
        remaining = {(tp.topic, tp.partition) for tp in assignment}
        out: list[Message] = []
        deadline = time.monotonic() + timeout
        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {sorted(remaining)} to the end")
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                err = msg.error()
                if err is None:
                    out.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    remaining.discard((msg.topic() or "", msg.partition() or 0))
        return out
    finally:
        consumer.close()


def read_partitions(
    settings: KafkaSettings, topic: str, *, committed: bool = True
) -> dict[int, list[Record]]:
    """Every record of `topic` as plain data, grouped by partition in offset order."""
    out: dict[int, list[Record]] = {}
    for msg in read_topics(settings, [topic], committed=committed):
        record = as_record(msg)
        out.setdefault(record.partition, []).append(record)
    return out


def as_record(msg: Message) -> Record:
    return Record(
        partition=msg.partition() or 0,
        offset=msg.offset() or 0,
        key=msg.key(),
        value=msg.value(),
        headers=msg.headers(),
        timestamp_ms=msg.timestamp()[1],
        timestamp_type=TimestampType.of_librdkafka(msg.timestamp()[0]),
    )


def read_partition(
    settings: KafkaSettings, topic: str, partition: int, start: int = 0, timeout: float = 600.0
) -> list[Record]:
    """One partition of `topic` from offset `start` to its end, read committed."""
    consumer = _reader(settings, committed=True)
    try:
        low, high = watermarks(consumer, TopicPartition(topic, partition))
        if max(start, low) >= high:
            return []
        consumer.assign([TopicPartition(topic, partition, max(start, low))])
        out: list[Record] = []
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic}[{partition}] to the end")
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return out
                    continue
                out.append(as_record(msg))
    finally:
        consumer.close()


def offset_for_time(settings: KafkaSettings, topic: str, partition: int, at_ms: int) -> int:
    """The first offset of `topic[partition]` with a timestamp at or after `at_ms`."""
    consumer = Consumer(settings.client({"group.id": f"runstate-reader-{uuid.uuid4().hex}"}))
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, partition, at_ms)], timeout=30)
        offset = found[0].offset
        if offset < 0:  # nothing at or after it
            return watermarks(consumer, TopicPartition(topic, partition))[1]
        return offset
    finally:
        consumer.close()


class TopicUnavailable(Exception):
    """A topic the broker does not have, or cannot describe."""


class Follower:
    """The values of a topic's committed records as they are appended (see `follow`);
    a context manager that closes its consumer."""

    def __init__(self, consumer: Consumer, limit: int | None) -> None:
        self._consumer = consumer
        self._limit = limit

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        while self._limit is None or seen < self._limit:
            msg = self._consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            yield msg.value() or b""
            seen += 1

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def follow(
    settings: KafkaSettings,
    topic: str,
    *,
    from_beginning: bool = False,
    limit: int | None = None,
    group_id: str = "runstate-tail",
) -> Follower:
    """`topic`'s committed records from now on, every partition from its end (or from
    its start, `from_beginning`), until `limit` of them (None: forever). The consumer
    commits nothing: `group_id` only names it to the broker. TopicUnavailable when the
    broker does not have the topic."""
    consumer = Consumer(
        settings.client(
            {
                "group.id": group_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
    )
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        if meta.error is not None:
            raise TopicUnavailable(f"{topic}: {meta.error}")
        start = []
        for p in meta.partitions:
            low, high = watermarks(consumer, TopicPartition(topic, p))
            start.append(TopicPartition(topic, p, low if from_beginning else high))
        consumer.assign(start)
    except BaseException:
        consumer.close()
        raise
    return Follower(consumer, limit)
