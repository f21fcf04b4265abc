"""Topic defaults on a real broker: `topics create` and `topics describe` with the
replication factor learned from the cluster (this one has a single broker: 1) and each
topic's retention, set by role; `replay` creates a lost changelog with the same."""

import json
import time
import uuid
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from processor.cli.main import cli
from processor.kafka.topic_plans import DAY_MS
from processor.kafka.topics import TopicNames


def runstate(bootstrap: str, prefix: str, *args: str, **env: str) -> Result:
    return CliRunner().invoke(
        cli,
        list(args),
        env={"RUNSTATE_BOOTSTRAP_SERVERS": bootstrap, "RUNSTATE_TOPIC_PREFIX": prefix, **env},
    )


def configs(admin: AdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names]
    found = admin.describe_configs(resources, request_timeout=30)
    return {r.name: {k: e.value for k, e in f.result().items()} for r, f in found.items()}


def replicas(admin: AdminClient, name: str) -> set[int]:
    topic = admin.list_topics(name, timeout=30).topics[name]
    return {len(p.replicas) for p in topic.partitions.values()}


def summary(result: Result) -> dict[str, Any]:
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_create_learns_the_factor_and_sets_each_retention(
    admin: AdminClient, kafka_bootstrap: str
) -> None:
    prefix = f"td-{uuid.uuid4().hex[:8]}."
    names = TopicNames.with_prefix(prefix)
    created = runstate(
        kafka_bootstrap,
        prefix,
        "topics",
        "create",
        "--partitions",
        "2",
        "--json",
        "--retention-ms",
        "dlq=3600000",
        "--retention-ms",
        "proposals=604800000",
    )
    assert created.exit_code == 0, created.output
    assert "warning: proposals kept 604800000 ms (7 days)" in created.stderr
    result = summary(created)
    assert (result["replication_factor"], result["replication_from"], result["brokers"]) == (
        1,
        "cluster",
        1,
    )
    assert {t["outcome"] for t in result["topics"]} == {"created"}
    assert result["drift"] == [] and len(result["warnings"]) == 1

    on_broker = configs(admin, [getattr(names, role) for role in result_roles(result)])
    assert on_broker[names.dlq]["retention.ms"] == "3600000"
    assert on_broker[names.proposals]["retention.ms"] == "604800000"
    assert on_broker[names.proposals]["message.timestamp.type"] == "LogAppendTime"
    assert on_broker[names.transitions]["retention.ms"] == "-1"
    assert on_broker[names.transitions]["retention.bytes"] == "-1"
    assert on_broker[names.rejections]["retention.ms"] == str(7 * DAY_MS)
    assert on_broker[names.heartbeats]["retention.ms"] == str(DAY_MS)
    assert on_broker[names.changelog]["cleanup.policy"] == "compact"
    assert on_broker[names.changelog]["min.insync.replicas"] == "1"
    assert all(replicas(admin, getattr(names, r)) == {1} for r in result_roles(result))

    # The same settings describe the topics exactly; the defaults find the two that
    # differ, and creating again with the defaults changes nothing, it reports them.
    same = runstate(
        kafka_bootstrap,
        prefix,
        "topics",
        "describe",
        "--partitions",
        "2",
        "--json",
        RUNSTATE_RETENTION_MS="dlq=3600000 proposals=604800000",
    )
    assert same.exit_code == 0, same.output
    assert summary(same)["drift"] == []
    again = runstate(kafka_bootstrap, prefix, "topics", "create", "--partitions", "2")
    assert again.exit_code == 1
    assert again.stdout.startswith(
        "replication factor 1 (min(3, brokers): the cluster has 1 broker)\n"
    )
    assert f"{names.dlq}: exists" in again.stdout
    assert f"drift: {names.dlq}: retention.ms is 3600000, expected {30 * DAY_MS}" in again.stderr
    assert f"drift: {names.proposals}: retention.ms is 604800000, expected -1" in again.stderr
    assert configs(admin, [names.dlq])[names.dlq]["retention.ms"] == "3600000"


def result_roles(result: dict[str, Any]) -> list[str]:
    return [t["role"] for t in result["topics"]]


def test_a_factor_the_cluster_cannot_hold_is_refused_clearly(kafka_bootstrap: str) -> None:
    prefix = f"td-{uuid.uuid4().hex[:8]}."
    refused = runstate(kafka_bootstrap, prefix, "topics", "create", "--replication-factor", "3")
    assert refused.exit_code == 1
    assert "cannot hold 3 replicas of a partition" in refused.output
    assert "--replication-factor no larger than its brokers" in refused.output
    assert runstate(kafka_bootstrap, prefix, "topics", "create").exit_code == 0
    described = runstate(
        kafka_bootstrap,
        prefix,
        "topics",
        "describe",
        "--json",
        RUNSTATE_REPLICATION_FACTOR="3",
    )
    assert described.exit_code == 1
    drift = summary(described)["drift"]
    assert {d["setting"] for d in drift} == {"replication factor", "min.insync.replicas"}
    assert {
        (d["expected"], d["actual"]) for d in drift if d["setting"] == "replication factor"
    } == {("3", "1")}


def _delete(admin: AdminClient, topic: str) -> None:
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result()
    for _ in range(150):
        if topic not in admin.list_topics(timeout=10).topics:
            return
        time.sleep(0.2)
    raise AssertionError(f"{topic} still exists")


def test_replay_creates_a_lost_changelog_with_the_same_defaults(
    admin: AdminClient, kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    prefix = topic_names.proposals.removesuffix("proposals")
    _delete(admin, topic_names.changelog)
    refused = runstate(
        kafka_bootstrap,
        prefix,
        "replay",
        "--state-dir",
        str(tmp_path / "s"),
        "--retention-ms",
        "changelog=60000",
    )
    assert refused.exit_code == 2 and "the changelog is compacted" in refused.output
    deadline = time.monotonic() + 60
    while True:  # the broker may still be finishing the deletion
        replayed = runstate(kafka_bootstrap, prefix, "replay", "--state-dir", str(tmp_path / "s"))
        if replayed.exit_code == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert replayed.exit_code == 0, replayed.output
    assert "stores rebuilt" in replayed.output
    changelog = configs(admin, [topic_names.changelog])[topic_names.changelog]
    assert changelog["cleanup.policy"] == "compact"
    assert replicas(admin, topic_names.changelog) == {1}  # min(3, one broker)
    topic = admin.list_topics(topic_names.changelog, timeout=30).topics[topic_names.changelog]
    assert len(topic.partitions) == 3  # the proposals' count
