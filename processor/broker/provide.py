"""One way to get a real broker, wherever we run. RUNSTATE_BROKER_SOURCE chooses: `auto`
(the default) takes the first that applies, `docker` and `launcher` insist.

1. KAFKA_BOOTSTRAP_SERVERS (or RUNSTATE_BOOTSTRAP_SERVERS) names one: use it as is.
2. A Docker engine answers and has the Kafka image (RUNSTATE_BROKER_IMAGE, default the
   official apache/kafka of the pinned version; `make images` builds one where no
   registry answers), or can pull it: a container of it (testcontainers).
3. Otherwise: the local launcher (Java 17 + Maven, jars from Maven Central).
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from processor.broker.launcher import KAFKA_VERSION, BrokerError, free_port, running_broker

ENV_VARS = ("KAFKA_BOOTSTRAP_SERVERS", "RUNSTATE_BOOTSTRAP_SERVERS")
CHOICE_ENV = "RUNSTATE_BROKER_SOURCE"
IMAGE_ENV = "RUNSTATE_BROKER_IMAGE"
CHOICES = ("auto", "docker", "launcher")


def configured_bootstrap() -> str | None:
    for name in ENV_VARS:
        value = os.environ.get(name)
        if value:
            return value
    return None


def kafka_image() -> str:
    return os.environ.get(IMAGE_ENV) or f"apache/kafka:{KAFKA_VERSION}"


def image_problem(image: str) -> str | None:
    """Why a container of `image` cannot be had here (None: it can): no engine answers,
    or the image is neither present nor pullable."""
    try:
        import docker
        from docker.errors import DockerException, ImageNotFound
    except ImportError:
        return "the docker package is not installed (pip install 'runstate[dev]')"
    try:
        client = docker.from_env(timeout=3)
        client.ping()
    except Exception:  # any failure means: no usable engine
        return "no Docker engine answers"
    try:
        try:
            client.images.get(image)
        except ImageNotFound:
            client.images.pull(image)
    except DockerException as exc:
        return f"the Docker engine has no {image} and cannot pull it ({str(exc)[:160]})"
    finally:
        client.close()
    return None


@dataclass(frozen=True)
class BrokerSource:
    """Where the broker comes from, and why that one: `configured`, `docker` or
    `launcher`."""

    kind: str
    why: str


def broker_source() -> BrokerSource:
    """The way to a broker RUNSTATE_BROKER_SOURCE asks for, or the first that applies."""
    choice = os.environ.get(CHOICE_ENV) or "auto"
    if choice not in CHOICES:
        raise BrokerError(f"{CHOICE_ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    configured = configured_bootstrap()
    if choice == "auto" and configured:
        return BrokerSource("configured", f"the broker at {configured}")
    if choice == "launcher":
        return BrokerSource("launcher", f"local launcher ({CHOICE_ENV}=launcher)")
    image = kafka_image()
    problem = image_problem(image)
    if problem is None:
        return BrokerSource("docker", f"a {image} container (testcontainers)")
    if "cannot pull" in problem:
        problem += (
            f"; `make images` builds one from Debian's packages and Maven Central, then "
            f"set {IMAGE_ENV}=runstate/kafka:{KAFKA_VERSION}"
        )
    if choice == "docker":
        raise BrokerError(f"{CHOICE_ENV}=docker, but {problem}")
    return BrokerSource("launcher", f"local launcher: {problem}")


@contextmanager
def kafka_container(image: str | None = None) -> Iterator[str]:
    """A KRaft container of `image` (default kafka_image()) with its client port on a
    free host port. The environment is the official image's; runstate/kafka reads it
    the same way."""
    from testcontainers.core.config import testcontainers_config
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    reaper = testcontainers_config.ryuk_image
    if not testcontainers_config.ryuk_disabled and image_problem(reaper) is not None:
        # No registry for the reaper either: the container still goes when the block
        # ends, but one left by a killed test run stays until `docker rm`.
        testcontainers_config.ryuk_disabled = True
    port = free_port()
    container = (
        DockerContainer(image or kafka_image())
        .with_bind_ports(9092, port)
        .with_env("KAFKA_NODE_ID", "1")
        .with_env("KAFKA_PROCESS_ROLES", "broker,controller")
        # Clients reach it through the host port; the broker reaches itself (its
        # transaction coordinator writes markers) on a listener of its own inside.
        .with_env("KAFKA_LISTENERS", "PLAINTEXT://:9092,BROKER://:9094,CONTROLLER://:9093")
        .with_env(
            "KAFKA_ADVERTISED_LISTENERS", f"PLAINTEXT://127.0.0.1:{port},BROKER://localhost:9094"
        )
        .with_env("KAFKA_INTER_BROKER_LISTENER_NAME", "BROKER")
        .with_env("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
        .with_env(
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT",
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
def provide_broker(
    data_dir: Path | None = None,
    console: Console | None = None,
    source: BrokerSource | None = None,
) -> Iterator[str]:
    """A bootstrap address of a real broker for the length of the block, from `source`
    (default: broker_source())."""
    source = source or broker_source()
    if source.kind == "configured":
        configured = configured_bootstrap()
        assert configured is not None
        yield configured
    elif source.kind == "docker":
        with kafka_container() as bootstrap:
            yield bootstrap
    else:
        with running_broker(data_dir, console=console) as broker:
            yield broker.bootstrap
