"""The Faust runtime's output producer: librdkafka (confluent-kafka), one batch of
records produced at once and awaited whole.

Outputs do not go through Faust's topics: aiokafka's producer builds its batches and
requests in Python, which cost about half of the runtime's CPU a proposal. Faust still
reads the proposals, assigns the partitions and restores the table from its changelog.

`deliver` produces every record in order (each partition keeps that order across
retries: `ordered`), then flushes on a thread of its own, where librdkafka waits for
the acknowledgements without the GIL and calls the delivery reports; the event loop
goes on meanwhile (the HTTP API, the timers).
"""

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from processor.kafka.config import KafkaSettings
from processor.records.outputs import OutputRecord
from processor.runtimes.faust.kafka import parse_acks

# How long a flush waits before it looks again (a delivery fails on its own, after
# the producer's message.timeout.ms).
FLUSH_STEP_S = 1.0
# A full local queue: wait for it to drain this long before trying the record again.
QUEUE_FULL_WAIT_S = 0.05


@dataclass
class Sendable:
    """An output record as it is produced: topic, partition, key, value and headers."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Any = None


def sendable(
    record: OutputRecord, partition: int, extra: Sequence[tuple[str, bytes]] = ()
) -> Sendable:
    """An output record as produced: in its own partition when it has one (a message to
    another run), else in the proposal's (`partition`); its headers and `extra`."""
    headers = [*(record.headers or ()), *extra] if extra else record.headers
    return Sendable(
        record.topic,
        partition if record.partition is None else record.partition,
        record.key,
        record.value,
        headers or None,
    )


#: How a batch of records is delivered: `OutputProducer.deliver`, or a test's stand-in.
Deliver = Callable[[Sequence[Sendable]], Awaitable[None]]


def ordered(settings: KafkaSettings) -> dict[str, Any]:
    """What keeps each partition's records in the order produced, across retries: an
    idempotent producer, which needs every replica's acknowledgement (`acks=all`, the
    default); with fewer acks asked for (`-X acks=1`), one request in flight at a time."""
    config = settings.client_config
    if parse_acks(config.get("acks", config.get("request.required.acks", "all"))) == -1:
        return {"enable.idempotence": True}
    return {"max.in.flight.requests.per.connection": 1}


class _Batch:
    """The delivery reports of one `deliver` call: the first error, if any."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: KafkaError | None = None

    def report(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None and self.error is None:
            self.error = err


class OutputProducer:
    """The runtime's one producer of outputs (decisions and timers alike)."""

    def __init__(self, settings: KafkaSettings, batch_size: int) -> None:
        """`batch_size`: at most what one batch of the topics written takes (the broker
        refuses a larger batch whole)."""
        self.client = Producer(
            settings.client(
                {**ordered(settings), "batch.size": batch_size},
                defaults={"linger.ms": 5, "compression.type": "lz4"},
            )
        )
        self._flusher = ThreadPoolExecutor(1, thread_name_prefix="runstate-flush")

    async def deliver(self, records: Sequence[Sendable]) -> None:
        """Produce `records` in order and return once every one is acknowledged; the
        first delivery error is raised (as `KafkaException`)."""
        if not records:
            return
        batch = _Batch()
        produce = self.client.produce
        for r in records:
            while True:
                try:
                    produce(
                        r.topic,
                        r.value,
                        r.key,
                        partition=r.partition,
                        headers=r.headers,
                        on_delivery=batch.report,
                    )
                    break
                except BufferError:  # the local queue is full: let it drain
                    await asyncio.sleep(QUEUE_FULL_WAIT_S)
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(self._flusher, self.client.flush, FLUSH_STEP_S):
            pass
        if batch.error is not None:
            raise KafkaException(batch.error)
