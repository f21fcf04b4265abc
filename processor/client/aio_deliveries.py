"""The asyncio client's delivery reports: its plain `confluent_kafka.Producer` polled on
a thread, each report the result of an asyncio future."""

import asyncio
import threading
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer


class Deliveries:
    """A producer's delivery reports, polled on a thread of their own and handed to the
    event loop as the results of futures."""

    def __init__(self, producer: Producer, loop: asyncio.AbstractEventLoop) -> None:
        self._producer = producer
        self._loop = loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="runstate-deliveries", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def reporter(self, future: "asyncio.Future[None]") -> Any:
        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            self._loop.call_soon_threadsafe(_settle, future, err)

        return on_delivery

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _settle(future: "asyncio.Future[None]", err: KafkaError | None) -> None:
    if future.done():
        return
    if err is None:
        future.set_result(None)
    else:
        future.set_exception(KafkaException(err))
