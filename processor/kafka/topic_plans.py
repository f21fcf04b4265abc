"""What each topic should be: partitions, replication, retention and the configs that
matter (`plan_topics`); the retention an operator may give instead, checked."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from processor.kafka.topics import TopicNames

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
