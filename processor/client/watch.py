"""Watching runs change: the transitions topic read as it grows (read_committed, no
consumer group, nothing committed), for one run or for the runs entering a state.

A watch says where it is: `position`, the next offset of each partition it reads. A
new watch given that position (`resume_from=`) goes on from exactly there, so a
watcher that stops and starts again misses no transition and sees none twice. Without
one, a run's watch starts at the beginning of the run's partition (or at `since_ms`,
broker time), a state's watch at the end of every partition (what enters it from now).
"""

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from pydantic import ValidationError

from processor.kafka.config import KafkaSettings
from processor.kafka.partitioning import partition_for
from processor.kafka.topics import TopicNames
from schemas.messages import Transition

from .core import consumer_config, unavailable
from .errors import NotFound

log = logging.getLogger("runstate.client")

#: A watch's place: partition of the transitions topic -> the next offset to read.
Position = dict[int, int]

#: How long one poll waits for a record before the watch looks again.
POLL_S = 0.5


class Watch:
    """Transitions as they commit, blocking: `for t in client.watch(run_id)`. `close()`
    (or a `with` block) ends it."""

    def __init__(
        self,
        settings: KafkaSettings,
        topics: TopicNames,
        select: Callable[[Transition], bool],
        *,
        run_id: str | None = None,
        resume_from: Position | None = None,
        since_ms: int | None = None,
        timeout: float = 30.0,
    ) -> None:
        """The transitions `select` keeps, of run `run_id`'s partition (None: every
        partition), from `resume_from`, else `since_ms`, else the start of the run's
        partition or the end of every partition."""
        self._select = select
        self._topic = topics.transitions
        self._settings = settings
        # One poll at a time, and no close during one (an async watch polls in a thread
        # that a cancelled task leaves running).
        self._lock = threading.Lock()
        self._closed = False
        self._consumer = Consumer(consumer_config(settings))
        try:
            self.position: Position = self._start(run_id, resume_from, since_ms, timeout)
        except KafkaException as exc:
            self._consumer.close()
            raise unavailable(settings, "starting a watch", timeout, exc) from exc
        except BaseException:
            self._consumer.close()
            raise
        self._consumer.assign(
            [TopicPartition(self._topic, p, offset) for p, offset in self.position.items()]
        )

    def _start(
        self,
        run_id: str | None,
        resume_from: Position | None,
        since_ms: int | None,
        timeout: float,
    ) -> Position:
        """Where each partition starts, as offsets: a position saved before the first
        record still says where this watch began."""
        consumer = self._consumer
        meta = consumer.list_topics(self._topic, timeout=timeout).topics.get(self._topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise NotFound(
                f"topic '{self._topic}' does not exist: create the topics (runstate topics "
                "create), or give the prefix they were created with"
            )
        count = len(meta.partitions)
        partitions = range(count) if run_id is None else [partition_for(run_id, count)]
        default = OFFSET_END if run_id is None else OFFSET_BEGINNING
        start = [TopicPartition(self._topic, p, default) for p in partitions]
        if resume_from:
            start = [
                TopicPartition(self._topic, p, resume_from.get(p, default)) for p in partitions
            ]
        elif since_ms is not None:
            wanted = [TopicPartition(self._topic, p, since_ms) for p in partitions]
            start = consumer.offsets_for_times(wanted, timeout=timeout)
        position: Position = {}
        for tp in start:
            if tp.error is not None:
                raise KafkaException(tp.error)
            low, high = consumer.get_watermark_offsets(
                TopicPartition(self._topic, tp.partition), timeout=timeout
            )
            offset = tp.offset
            if offset < 0:  # the start or the end, or no record since `since_ms`
                offset = low if offset == OFFSET_BEGINNING else high
            position[tp.partition] = offset
        return position

    def poll(self, timeout: float = POLL_S) -> Transition | None:
        """The next transition the watch keeps, or None when none came within `timeout`.
        Unavailable on a fatal Kafka error; NotFound when the topic is gone."""
        with self._lock:
            if self._closed:
                return None
            message = self._consumer.poll(timeout)
        if message is None:
            return None
        error = message.error()
        if error is not None:
            if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise NotFound(f"topic '{self._topic}' is gone: {error}")
            if error.fatal():
                raise unavailable(self._settings, "watching", timeout, error)
            log.warning("watching %s: %s", self._topic, error)  # librdkafka retries
            return None
        partition, offset = message.partition(), message.offset()
        if partition is None or offset is None:
            return None
        self.position[partition] = offset + 1
        try:
            transition = Transition.model_validate_json(message.value() or b"")
        except ValidationError:  # not a transition this SDK reads: passed over
            log.warning("offset %d of %s is no transition", offset, self._topic)
            return None
        return transition if self._select(transition) else None

    def __iter__(self) -> Iterator[Transition]:
        while True:
            found = self.poll()
            if found is not None:
                yield found

    def close(self) -> None:
        with self._lock:  # after a poll under way, never during it
            if not self._closed:
                self._closed = True
                self._consumer.close()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class AsyncWatch:
    """`async for t in client.watch(run_id)`: a `Watch` made and polled in a thread."""

    def __init__(self, make: Callable[[], Watch]) -> None:
        self._make = make
        self._watch: Watch | None = None

    @property
    def position(self) -> Position:
        return {} if self._watch is None else self._watch.position

    async def __aiter__(self) -> AsyncIterator[Transition]:
        if self._watch is None:
            self._watch = await asyncio.to_thread(self._make)
        while True:
            found = await asyncio.to_thread(self._watch.poll)
            if found is not None:
                yield found

    async def close(self) -> None:
        if self._watch is not None:
            await asyncio.to_thread(self._watch.close)

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


def run_watch(
    settings: KafkaSettings,
    topics: TopicNames,
    run_id: str,
    resume_from: Position | None,
    since_ms: int | None,
    timeout: float,
) -> Watch:
    """Run `run_id`'s transitions as they commit."""
    return Watch(
        settings,
        topics,
        lambda t: t.run_id == run_id,
        run_id=run_id,
        resume_from=resume_from,
        since_ms=since_ms,
        timeout=timeout,
    )


def state_watch(
    settings: KafkaSettings,
    topics: TopicNames,
    state: str,
    machine: str | None,
    resume_from: Position | None,
    timeout: float,
) -> Watch:
    """The transitions into `state` (of `machine`'s runs, or any) as they commit."""
    return Watch(
        settings,
        topics,
        lambda t: t.to_state == state and (machine is None or t.machine == machine),
        resume_from=resume_from,
        timeout=timeout,
    )
