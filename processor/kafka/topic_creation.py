"""Topics created as planned: the replication factor the cluster gets, the missing
topics created, and every partition led before a client comes."""

import time
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaException

# The admin classes live in a submodule whose stubs do not re-export them.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from processor.kafka.topic_plans import (
    TopicDefaults,
    TopicPlan,
    TopicSettingError,
    default_replication,
    plan_topics,
)
from processor.kafka.topics import TopicNames


def count_brokers(admin: AdminClient, timeout: float = 30.0) -> int:
    """The brokers the cluster describes (every live one)."""
    return len(admin.describe_cluster(request_timeout=timeout).result().nodes)


@dataclass(frozen=True)
class Provisioned:
    plans: list[TopicPlan]
    replication: int
    brokers: int | None  # None when the replication factor was given
    outcome: dict[str, str]  # topic -> created | exists


def resolve_plans(
    admin: AdminClient, names: TopicNames, defaults: TopicDefaults, timeout: float = 30.0
) -> tuple[list[TopicPlan], int, int | None]:
    """The plans for this cluster: (plans, replication factor, brokers counted or None)."""
    brokers = None
    replication = defaults.replication
    if replication is None:
        brokers = count_brokers(admin, timeout)
        replication = default_replication(brokers)
    plans = plan_topics(names, defaults.partitions, replication, defaults.retention_ms)
    return plans, replication, brokers


def provision_topics(
    admin: AdminClient, names: TopicNames, defaults: TopicDefaults, timeout: float = 30.0
) -> Provisioned:
    """Create the missing topics with the same defaults everywhere (see TopicDefaults)."""
    plans, replication, brokers = resolve_plans(admin, names, defaults, timeout)
    outcome = create_topics(admin, plans, timeout)
    return Provisioned(plans, replication, brokers, outcome)


def create_topics(
    admin: AdminClient, plans: Iterable[TopicPlan], timeout: float = 30.0
) -> dict[str, str]:
    """Create what is missing; existing topics are left as they are (see describe)."""
    plans = list(plans)
    futures = admin.create_topics(
        [NewTopic(p.name, p.partitions, p.replication, config=p.config) for p in plans],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    outcome = {}
    for name, future in futures.items():
        try:
            future.result()
            outcome[name] = "created"
        except KafkaException as exc:
            code = exc.args[0].name()
            if code == "INVALID_REPLICATION_FACTOR":
                factor = next(p.replication for p in plans if p.name == name)
                raise TopicSettingError(
                    f"{name}: the cluster cannot hold {factor} replicas of a partition "
                    f"({exc.args[0].str()}); give a --replication-factor no larger than "
                    "its brokers, or leave it out for min(3, brokers)"
                ) from exc
            if code != "TOPIC_ALREADY_EXISTS":
                raise
            outcome[name] = "exists"
    _wait_for_leaders(admin, [p.name for p in plans], timeout)
    return outcome


def _wait_for_leaders(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Creation returns before every partition has a leader the cluster knows of; a
    client that comes at once meets UNKNOWN_TOPIC_OR_PART or NOT_LEADER. Wait it out."""
    deadline = time.monotonic() + timeout
    while True:
        topics = admin.list_topics(timeout=timeout).topics
        ready = all(
            name in topics
            and topics[name].error is None
            and topics[name].partitions
            and all(p.leader >= 0 for p in topics[name].partitions.values())
            for name in names
        )
        if ready:
            return
        if time.monotonic() > deadline:
            raise KafkaException(f"topics {names} have no leaders after {timeout:.0f}s")
        time.sleep(0.1)
