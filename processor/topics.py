"""The topics runstate reads and writes, their settings, creation and drift checks."""

import time
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaException

# The admin classes live in a submodule whose stubs do not re-export them.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)

DEFAULT_PREFIX = "runstate."


@dataclass(frozen=True)
class TopicNames:
    proposals: str
    transitions: str
    rejections: str
    dlq: str
    changelog: str
    alerts: str
    heartbeats: str

    @classmethod
    def with_prefix(cls, prefix: str = DEFAULT_PREFIX) -> "TopicNames":
        return cls(
            proposals=f"{prefix}proposals",
            transitions=f"{prefix}transitions",
            rejections=f"{prefix}rejections",
            dlq=f"{prefix}dlq",
            changelog=f"{prefix}runs-changelog",
            alerts=f"{prefix}alerts",
            heartbeats=f"{prefix}heartbeats",
        )


@dataclass(frozen=True)
class TopicPlan:
    """A topic as runstate needs it: partitions, replication and the configs that matter."""

    name: str
    role: str
    partitions: int
    replication: int
    config: dict[str, str]


def plan_topics(names: TopicNames, partitions: int, replication: int) -> list[TopicPlan]:
    """Every topic keyed by run_id shares the proposals' partition count, so a run's
    proposals, transitions and changelog records live in the same partition number."""
    isr = {"min.insync.replicas": str(min(2, replication))} if replication > 1 else {}
    forever = {"retention.ms": "-1", "retention.bytes": "-1"}
    return [
        TopicPlan(
            names.proposals,
            "proposals",
            partitions,
            replication,
            # The broker's append time is the time of each decision;
            # kept forever: it is the complete input log that replay and verify read.
            {"message.timestamp.type": "LogAppendTime", **forever, **isr},
        ),
        TopicPlan(
            names.transitions,
            "transitions",
            partitions,
            replication,
            {"cleanup.policy": "delete", **forever, **isr},
        ),
        TopicPlan(names.rejections, "rejections", partitions, replication, {**isr}),
        TopicPlan(names.dlq, "dlq", partitions, replication, {**isr}),
        TopicPlan(
            names.changelog,
            "changelog",
            partitions,
            replication,
            {"cleanup.policy": "compact", **isr},
        ),
        TopicPlan(names.alerts, "alerts", partitions, replication, {**isr}),
        # Answers to heartbeats, for the agent that waits for one: the run's liveness
        # itself is kept in the changelog's snapshot, so a day of answers is plenty.
        TopicPlan(
            names.heartbeats,
            "heartbeats",
            partitions,
            replication,
            {"cleanup.policy": "delete", "retention.ms": str(24 * 3600 * 1000), **isr},
        ),
    ]


@dataclass(frozen=True)
class Drift:
    topic: str
    setting: str
    expected: str
    actual: str

    def __str__(self) -> str:
        return f"{self.topic}: {self.setting} is {self.actual}, expected {self.expected}"


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
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
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


def describe_topics(
    admin: AdminClient, plans: Iterable[TopicPlan], timeout: float = 30.0
) -> list[Drift]:
    """Every difference between the cluster and the plan; empty when they agree."""
    plans = list(plans)
    metadata = admin.list_topics(timeout=timeout)
    drift = []
    present = []
    for plan in plans:
        topic = metadata.topics.get(plan.name)
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
        futures = admin.describe_configs(
            [ConfigResource(ConfigResource.Type.TOPIC, p.name) for p in present],
            request_timeout=timeout,
        )
        actual = {res.name: fut.result() for res, fut in futures.items()}
        for plan in present:
            for key, expected in plan.config.items():
                entry = actual[plan.name].get(key)
                value = entry.value if entry is not None else "(unset)"
                if value != expected:
                    drift.append(Drift(plan.name, key, expected, str(value)))
    return drift


def max_message_bytes(
    admin: AdminClient, topics: Iterable[str], timeout: float = 30.0
) -> dict[str, int]:
    """Each topic's effective `max.message.bytes`: the largest record batch it takes."""
    futures = admin.describe_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, name) for name in topics],
        request_timeout=timeout,
    )
    found = {}
    for resource, future in futures.items():
        entry = future.result().get("max.message.bytes")
        if entry is not None and entry.value is not None:
            found[resource.name] = int(entry.value)
    return found
