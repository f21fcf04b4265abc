"""Read the transitions topic (and the rejections topic) read_committed, from stored
offsets, for consumers outside the workers: analytics exports, warehouses, audits.

The caller keeps the positions: it passes `{partition: next_offset}` per topic, reads,
and stores `reader.positions()` once what it read is safely written. The next reader
given those positions starts exactly after it, so a consumer that stores its positions
after its own output sees every record once (at least once, if it stops between writing
and storing).

Without `follow`, the reader stops at the end as it was when it started: the high
watermark of every partition, read when the reader starts. Records committed later wait
for the next read. A transaction still open at the start is waited for (a worker commits
every 100 ms; a crashed worker's transaction is aborted within `transaction.timeout.ms`).
With `follow`, it never stops: the caller breaks out of the loop. The positions are then
just past the last record yielded (a transaction's commit marker may follow it: the next
reader steps over it).
"""

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from confluent_kafka import Consumer, KafkaError, TopicPartition
from pydantic import ValidationError

from processor.kafka.config import KafkaSettings
from processor.kafka.readback import watermarks
from processor.kafka.topics import TopicNames
from schemas.messages import Rejection, Transition

#: topic kind -> {partition: next offset to read}
Positions = dict[str, dict[int, int]]
KINDS = ("transitions", "rejections")


class Entry(NamedTuple):
    """One record read: `for partition, offset, record in reader`."""

    partition: int
    offset: int
    record: Transition | Rejection


class ReadError(Exception):
    """The stored positions do not fit the topic, or a record is not what the topic holds."""


@dataclass
class Gap:
    """Records deleted by retention before they were read: a stored position below the
    partition's first offset. The reader starts at the first offset that still exists."""

    kind: str
    partition: int
    stored: int
    low: int

    @property
    def lost(self) -> int:
        return self.low - self.stored


@dataclass
class _Partition:
    kind: str
    topic: str
    partition: int
    position: int  # the next offset to read
    end: int  # the high watermark at the start; -1 while following
    done: bool = False


@dataclass
class TransitionReader:
    """Transitions (and, with `rejections=True`, rejections) from `positions` to the end.

    `positions` is what `positions()` returned last time, `{"transitions": {0: 12, ...},
    "rejections": {...}}`; a partition not in it is read from its first offset."""

    settings: KafkaSettings
    topics: TopicNames
    positions_from: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    rejections: bool = False
    follow: bool = False
    poll_timeout: float = 0.5
    gaps: list[Gap] = field(default_factory=list, init=False)
    _partitions: dict[tuple[str, int], _Partition] = field(default_factory=dict, init=False)
    _consumer: Consumer | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._consumer = Consumer(
            self.settings.client(
                {
                    # Never joins the group nor commits: assign() only, positions are the caller's.
                    "group.id": f"runstate-export-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                }
            )
        )
        try:
            self._assign()
        except BaseException:
            self.close()
            raise

    def _topic(self, kind: str) -> str:
        return self.topics.transitions if kind == "transitions" else self.topics.rejections

    def _assign(self) -> None:
        assert self._consumer is not None
        kinds = KINDS if self.rejections else KINDS[:1]
        assignment: list[TopicPartition] = []
        for kind in kinds:
            topic = self._topic(kind)
            meta = self._consumer.list_topics(topic, timeout=30).topics[topic]
            if meta.error is not None:
                raise ReadError(f"{topic}: {meta.error}; run `runstate topics create`?")
            stored = self.positions_from.get(kind, {})
            for p in sorted(meta.partitions):
                low, high = watermarks(self._consumer, TopicPartition(topic, p))
                start = stored.get(p, low)
                if start > high:
                    raise ReadError(
                        f"{topic}[{p}]: the stored position {start} is past the end "
                        f"({high}): the topic was created again? Start a new offsets file."
                    )
                if start < low:
                    self.gaps.append(Gap(kind, p, start, low))
                    start = low
                part = _Partition(kind, topic, p, start, -1 if self.follow else high)
                part.done = not self.follow and start >= high
                self._partitions[(topic, p)] = part
                assignment.append(TopicPartition(topic, p, start))
        self._consumer.assign(assignment)

    def positions(self) -> Positions:
        """{kind: {partition: next offset}}: store it, pass it to the next reader."""
        out: Positions = {}
        for part in self._partitions.values():
            out.setdefault(part.kind, {})[part.partition] = part.position
        return out

    def remaining(self) -> int:
        """Records (and transaction markers) left before the end; 0 while following."""
        return sum(max(0, p.end - p.position) for p in self._partitions.values())

    def __iter__(self) -> Iterator[Entry]:
        consumer = self._consumer
        if consumer is None:
            raise ReadError("the reader is closed")
        while self.follow or not all(p.done for p in self._partitions.values()):
            for msg in consumer.consume(num_messages=1000, timeout=self.poll_timeout):
                part = self._partitions.get((msg.topic() or "", msg.partition() or 0))
                if part is None or part.done:
                    continue  # past the end taken at the start: the next read's
                err = msg.error()
                offset = msg.offset() or 0
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        # The end, past any transaction markers: the next read starts here.
                        part.position = max(part.position, offset)
                        part.done = not self.follow and part.position >= part.end
                        continue
                    if not err.fatal():
                        continue  # librdkafka retries by itself
                    raise ReadError(f"{part.topic}[{part.partition}]: {err}")
                if not self.follow and offset >= part.end:
                    # Committed after the start, behind a commit marker that read_committed
                    # never delivers: everything before the end has been read.
                    part.position, part.done = part.end, True
                    continue
                record = self._decode(part, offset, msg.value() or b"")
                part.position = offset + 1
                part.done = not self.follow and part.position >= part.end
                yield Entry(part.partition, offset, record)

    def _decode(self, part: _Partition, offset: int, value: bytes) -> Transition | Rejection:
        model = Transition if part.kind == "transitions" else Rejection
        try:
            return model.model_validate_json(value)
        except ValidationError as exc:
            # Only workers write these topics: a record that does not parse is a finding.
            where = f"{part.topic}[{part.partition}]@{offset}"
            raise ReadError(f"{where}: not a {part.kind[:-1]}: {exc}") from exc

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> "TransitionReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
