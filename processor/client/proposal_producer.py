"""The blocking client's producer of proposals: each record handed to an idempotent
producer without waiting on the broker; a delivery that failed is raised by the next
`flush`."""

from typing import Any

from confluent_kafka import KafkaException, Producer

from processor.kafka.config import KafkaSettings

from .core import producer_config, unavailable

Headers = list[tuple[str, str | bytes | None]]


class ProposalProducer:
    """Produces to the proposals topic `topic`; `flush` says whether all of it arrived."""

    def __init__(self, settings: KafkaSettings, topic: str, timeout: float) -> None:
        self.settings = settings
        self.topic = topic
        self._producer = Producer(producer_config(settings, timeout))
        self._delivery_error: Exception | None = None

    def produce(self, key: bytes | None, value: bytes, headers: Headers) -> None:
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    key=key,
                    value=value,
                    headers=headers,
                    on_delivery=self._on_delivery,
                )
                break
            except BufferError:
                self._producer.poll(0.05)
        self._producer.poll(0)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._delivery_error = KafkaException(err)

    def flush(self, timeout: float) -> None:
        """Wait until every proposal produced is delivered; `Unavailable` when one could
        not be, or not within `timeout`."""
        left = self._producer.flush(timeout)
        if self._delivery_error is not None:
            error, self._delivery_error = self._delivery_error, None
            raise unavailable(self.settings, "delivering a proposal", timeout, error)
        if left:
            raise unavailable(
                self.settings, f"delivering proposals ({left} not delivered)", timeout, "timed out"
            )

    def close(self, timeout: float) -> None:
        """Deliver what was produced, within `timeout`; failures are not raised."""
        self._producer.flush(timeout)
