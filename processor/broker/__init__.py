"""A local Apache Kafka broker for developers, tests and the demo (no Docker needed)."""

from processor.broker.launcher import (
    KAFKA_VERSION,
    Broker,
    BrokerError,
    ensure_jars,
    running_broker,
    start_broker,
)

__all__ = [
    "KAFKA_VERSION",
    "Broker",
    "BrokerError",
    "ensure_jars",
    "running_broker",
    "start_broker",
]
