"""A local Apache Kafka broker, or a cluster of them, for developers, tests and the demo
(no Docker needed)."""

from processor.broker.cluster import Cluster, running_cluster, start_cluster
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
    "Cluster",
    "ensure_jars",
    "running_broker",
    "running_cluster",
    "start_broker",
    "start_cluster",
]
