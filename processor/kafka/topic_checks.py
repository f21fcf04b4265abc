"""Topics checked against their plans: every drift from them, and the configs a topic
has (the largest record batch it takes among them)."""

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

# The admin classes live in a submodule whose stubs do not re-export them.
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from processor.kafka.topic_plans import TopicPlan


@dataclass(frozen=True)
class Drift:
    topic: str
    setting: str
    expected: str
    actual: str

    def __str__(self) -> str:
        return f"{self.topic}: {self.setting} is {self.actual}, expected {self.expected}"


def describe_topics(
    admin: AdminClient, plans: Iterable[TopicPlan], timeout: float = 30.0
) -> list[Drift]:
    """Every difference between the cluster and the plan; empty when they agree."""
    plans = list(plans)
    topics = _complete_metadata(admin, [p.name for p in plans], timeout)
    drift = []
    present = []
    for plan in plans:
        topic = topics.get(plan.name)
        if topic is None or topic.error is not None:
            drift.append(Drift(plan.name, "existence", "present", "missing"))
            continue
        present.append(plan)
        partitions = len(topic.partitions)
        if partitions != plan.partitions:
            drift.append(Drift(plan.name, "partitions", str(plan.partitions), str(partitions)))
        replicas = min(len(p.replicas) for p in topic.partitions.values())
        if replicas != plan.replication:
            drift.append(
                Drift(plan.name, "replication factor", str(plan.replication), str(replicas))
            )
    if present:
        actual = topic_configs(admin, [p.name for p in present], timeout)
        for plan in present:
            for key, expected in plan.config.items():
                entry = actual[plan.name].get(key)
                value = entry.value if entry is not None else "(unset)"
                if value != expected:
                    drift.append(Drift(plan.name, key, expected, str(value)))
    return drift


#: How long a topic may look missing before it is reported so (seconds): see below.
METADATA_WAIT_S = 1.0


def _complete_metadata(admin: AdminClient, names: list[str], timeout: float) -> dict[str, Any]:
    """The cluster's topic metadata, asked again for up to METADATA_WAIT_S while any of
    `names` is missing. Each broker learns of a new topic from the controller on its
    own, and each request may go to another broker: on a three-node cluster one that
    did not know them yet answered right after `topics create` had seen them all led,
    and a describe reported them missing."""
    waited = time.monotonic() + METADATA_WAIT_S
    while True:
        topics: dict[str, Any] = admin.list_topics(timeout=timeout).topics
        missing = [n for n in names if n not in topics or topics[n].error is not None]
        if not missing or time.monotonic() > waited:
            return topics
        time.sleep(0.1)


def max_message_bytes(
    admin: AdminClient, topics: Iterable[str], timeout: float = 30.0
) -> dict[str, int]:
    """Each topic's effective `max.message.bytes`: the largest record batch it takes."""
    found = {}
    for name, config in topic_configs(admin, list(topics), timeout).items():
        entry = config.get("max.message.bytes")
        if entry is not None and entry.value is not None:
            found[name] = int(entry.value)
    return found


def topic_configs(admin: AdminClient, names: list[str], timeout: float) -> dict[str, Any]:
    """Each topic's config entries. In a cluster, each broker learns of a new topic
    from the controller on its own: the one asked may not know a topic that another
    just reported created (UNKNOWN_TOPIC_OR_PART, seen on a three-node cluster right
    after `topics create`), so it is asked again until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        futures = admin.describe_configs(
            [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names],
            request_timeout=timeout,
        )
        try:
            return {resource.name: future.result() for resource, future in futures.items()}
        except KafkaException as exc:
            unknown = exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            if not unknown or time.monotonic() > deadline:
                raise
        time.sleep(0.1)
