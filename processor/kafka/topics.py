"""The topics runstate reads and writes, their settings, creation and drift checks."""

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException

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
    machines: str

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
            machines=f"{prefix}machines",
        )


ROLES = (
    "proposals",
    "transitions",
    "rejections",
    "dlq",
    "changelog",
    "alerts",
    "heartbeats",
    "machines",
)
#: Compacted: each key's latest record is kept however old, so no retention time.
COMPACTED = ("changelog", "machines")
FOREVER = -1
DAY_MS = 24 * 3600 * 1000

#: How long each deleted-by-time topic keeps its records unless told otherwise (ms;
#: -1 forever). The changelog is compacted, not deleted by time: it has no entry.
DEFAULT_RETENTION_MS: dict[str, int] = {
    # The complete input log: `verify` (and the fault harness's oracle) read it from
    # offset 0, and its broker timestamps are the time of each decision.
    "proposals": FOREVER,
    # The audit log: `replay` and `get --at` rebuild runs from it, from offset 0.
    "transitions": FOREVER,
    # Answers a client waits for (seconds); verify decides them again from proposals.
    "rejections": 7 * DAY_MS,
    # Records nobody could decide: kept long enough for a person to look at them.
    "dlq": 30 * DAY_MS,
    # Read by alerting as they come.
    "alerts": 7 * DAY_MS,
    # Answers to heartbeats, for the agent that waits for one: the run's liveness
    # itself is kept in the changelog's snapshot.
    "heartbeats": DAY_MS,
}
#: Read from offset 0 by replay and verify: shortening them is allowed, with a warning.
READ_FROM_START = ("proposals", "transitions")


class TopicSettingError(ValueError):
    """A topic setting that cannot be meant (an unknown role, a time on a compacted
    topic, a retention of zero); the message says why and what to do."""


def parse_retention(items: Iterable[str]) -> dict[str, int]:
    """`ROLE=MS` items (MS: milliseconds, or -1 for forever) to {role: ms}."""
    found: dict[str, int] = {}
    for item in items:
        role, sep, value = item.partition("=")
        role = role.strip()
        if not sep:
            raise TopicSettingError(f"'{item}' is not ROLE=MS (e.g. dlq=604800000)")
        if role == "changelog":
            raise TopicSettingError(
                "the changelog is compacted: it keeps each run's latest snapshot, however "
                "old, and restores the stores from it, so it takes no retention time (one "
                "would drop the runs that have not changed lately)"
            )
        if role == "machines":
            raise TopicSettingError(
                "the machines topic is compacted: it keeps every machine version a run may "
                "be pinned to, however old, so it takes no retention time"
            )
        if role not in DEFAULT_RETENTION_MS:
            raise TopicSettingError(
                f"no topic role '{role}'; roles: {', '.join(DEFAULT_RETENTION_MS)}"
            )
        try:
            ms = int(value.strip())
        except ValueError:
            raise TopicSettingError(
                f"{role}={value}: retention is whole milliseconds, or -1 for forever"
            ) from None
        if ms == 0 or ms < FOREVER:
            raise TopicSettingError(
                f"{role}={value}: retention is a positive number of milliseconds, or -1 "
                "for forever (0 would delete records as soon as they are written)"
            )
        if role in found and found[role] != ms:
            raise TopicSettingError(f"{role} is given twice ({found[role]} and {ms})")
        found[role] = ms
    return found


def retention_warnings(retention: Mapping[str, int]) -> list[str]:
    """What a retention given for the topics read from offset 0 costs."""
    warnings = []
    for role in READ_FROM_START:
        ms = retention.get(role, FOREVER)
        if ms == FOREVER:
            continue
        reader = (
            "`runstate verify` reads it from offset 0 and cannot check transitions whose "
            "proposals expired"
            if role == "proposals"
            else "`runstate replay` and `get --at` rebuild runs from offset 0 and cannot "
            "rebuild a run whose first transitions expired"
        )
        warnings.append(f"{role} kept {ms} ms ({ms / DAY_MS:g} days) instead of forever: {reader}")
    return warnings


def default_replication(brokers: int) -> int:
    """The replication factor a cluster of `brokers` gets by default: min(3, brokers)."""
    return max(1, min(3, brokers))


def min_insync_replicas(replication: int) -> int | None:
    """`min.insync.replicas` for a replication factor; None leaves the broker's (1).

    3 or more: 2, so an acknowledged write is on two brokers and one may be down.
    2: 1, so one broker down does not stop every producer (with 2 a write would need
    both); acknowledged writes may then be on one broker only. 1: nothing to choose.
    """
    if replication <= 1:
        return None
    return 1 if replication == 2 else 2


def count_brokers(admin: AdminClient, timeout: float = 30.0) -> int:
    """The brokers the cluster describes (every live one)."""
    return len(admin.describe_cluster(request_timeout=timeout).result().nodes)


@dataclass(frozen=True)
class TopicPlan:
    """A topic as runstate needs it: partitions, replication and the configs that matter."""

    name: str
    role: str
    partitions: int
    replication: int
    config: dict[str, str]


def plan_topics(
    names: TopicNames,
    partitions: int,
    replication: int,
    retention_ms: Mapping[str, int] | None = None,
) -> list[TopicPlan]:
    """Every topic keyed by run_id shares the proposals' partition count, so a run's
    proposals, transitions and changelog records live in the same partition number.
    `retention_ms` overrides DEFAULT_RETENTION_MS per role (see parse_retention)."""
    isr_count = min_insync_replicas(replication)
    isr = {"min.insync.replicas": str(isr_count)} if isr_count is not None else {}
    retention = {**DEFAULT_RETENTION_MS, **(retention_ms or {})}

    def kept(role: str) -> dict[str, str]:
        ms = retention[role]
        config = {"cleanup.policy": "delete", "retention.ms": str(ms)}
        if ms == FOREVER:  # not cut short by size either
            config["retention.bytes"] = "-1"
        return {**config, **isr}

    def plan(role: str, config: dict[str, str]) -> TopicPlan:
        return TopicPlan(getattr(names, role), role, partitions, replication, config)

    return [
        # The broker's append time is the time of each decision.
        plan("proposals", {"message.timestamp.type": "LogAppendTime", **kept("proposals")}),
        plan("transitions", kept("transitions")),
        plan("rejections", kept("rejections")),
        plan("dlq", kept("dlq")),
        plan("changelog", {"cleanup.policy": "compact", **isr}),
        plan("alerts", kept("alerts")),
        plan("heartbeats", kept("heartbeats")),
        # Every machine version, keyed <name>@<version> (processor/history/versions.py): one
        # partition, read whole by every worker and auditor at start.
        # Their time is the broker's too: a key's revocation is judged by it.
        TopicPlan(
            names.machines,
            "machines",
            1,
            replication,
            {"cleanup.policy": "compact", "message.timestamp.type": "LogAppendTime", **isr},
        ),
    ]


@dataclass(frozen=True)
class TopicDefaults:
    """What `runstate topics create`, `runstate replay` and a rebuild create topics
    with: replication None means min(3, the cluster's brokers)."""

    partitions: int = 6
    replication: int | None = None
    retention_ms: Mapping[str, int] = field(default_factory=dict)


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


def describe_topics(
    admin: AdminClient, plans: Iterable[TopicPlan], timeout: float = 30.0
) -> list[Drift]:
    """Every difference between the cluster and the plan; empty when they agree."""
    plans = list(plans)
    topics = _settled_metadata(admin, [p.name for p in plans], timeout)
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
SETTLE_S = 1.0


def _settled_metadata(admin: AdminClient, names: list[str], timeout: float) -> dict[str, Any]:
    """The cluster's topic metadata, asked again for up to SETTLE_S while any of
    `names` is missing. Each broker learns of a new topic from the controller on its
    own, and each request may go to another broker: on a three-node cluster one that
    did not know them yet answered right after `topics create` had seen them all led,
    and a describe reported them missing."""
    settle = time.monotonic() + SETTLE_S
    while True:
        topics: dict[str, Any] = admin.list_topics(timeout=timeout).topics
        missing = [n for n in names if n not in topics or topics[n].error is not None]
        if not missing or time.monotonic() > settle:
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
