"""One way to get a real broker, wherever we run: the first that applies wins.

1. KAFKA_BOOTSTRAP_SERVERS (or RUNSTATE_BOOTSTRAP_SERVERS) names one: use it as is.
2. A Docker engine answers: an `apache/kafka` container of the pinned version.
3. Otherwise: the local launcher (Java 17 + Maven, jars from Maven Central).
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from processor.broker.launcher import KAFKA_VERSION, free_port, running_broker

ENV_VARS = ("KAFKA_BOOTSTRAP_SERVERS", "RUNSTATE_BOOTSTRAP_SERVERS")


def configured_bootstrap() -> str | None:
    for name in ENV_VARS:
        value = os.environ.get(name)
        if value:
            return value
    return None


def docker_available() -> bool:
    """True when a Docker engine answers (the CLI alone is not enough)."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        client.close()
        return True
    except Exception:  # any failure means: no usable engine
        return False


@contextmanager
def kafka_container() -> Iterator[str]:
    """An apache/kafka KRaft container with its client port on a free host port."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    port = free_port()
    container = (
        DockerContainer(f"apache/kafka:{KAFKA_VERSION}")
        .with_bind_ports(9092, port)
        .with_env("KAFKA_NODE_ID", "1")
        .with_env("KAFKA_PROCESS_ROLES", "broker,controller")
        .with_env("KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093")
        .with_env("KAFKA_ADVERTISED_LISTENERS", f"PLAINTEXT://127.0.0.1:{port}")
        .with_env("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
        .with_env(
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
        )
        .with_env("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
        .with_env("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS", "1")
        .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
    )
    with container:
        wait_for_logs(container, "Kafka Server started", timeout=120)
        yield f"127.0.0.1:{port}"


@contextmanager
def provide_broker(data_dir: Path | None = None, console: Console | None = None) -> Iterator[str]:
    """A bootstrap address of a real broker for the length of the block."""
    configured = configured_bootstrap()
    if configured:
        yield configured
    elif docker_available():
        with kafka_container() as bootstrap:
            yield bootstrap
    else:
        with running_broker(data_dir, console=console) as broker:
            yield broker.bootstrap
