"""Topic defaults that fit production: replication min(3, brokers), min.insync.replicas
from it, each topic's retention documented and settable by role; one function creates
topics for `topics create`, `replay` and a rebuild. Over a fake cluster (no broker)."""

import json
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, KafkaException

from processor.cli.main import cli
from processor.kafka.topic_creation import count_brokers, provision_topics, resolve_plans
from processor.kafka.topic_plans import (
    COMPACTED,
    DAY_MS,
    DEFAULT_RETENTION_MS,
    FOREVER,
    TopicDefaults,
    TopicSettingError,
    default_replication,
    min_insync_replicas,
    parse_retention,
    plan_topics,
    retention_warnings,
)
from processor.kafka.topics import ROLES, TopicNames

NAMES = TopicNames.with_prefix("rs.")


def done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


@dataclass
class FakeCluster:
    """Enough of AdminClient for plans, creation and drift: `brokers` nodes; the topics
    created keep their partitions, replication factor and config."""

    brokers: int
    topics: dict[str, Any] = field(default_factory=dict)
    described: int = 0

    def describe_cluster(self, **_: Any) -> Future[Any]:
        self.described += 1
        return done(SimpleNamespace(nodes=[SimpleNamespace(id=i) for i in range(self.brokers)]))

    def create_topics(self, new_topics: list[Any], **_: Any) -> dict[str, Future[Any]]:
        futures: dict[str, Future[Any]] = {}
        for topic in new_topics:
            futures[topic.topic] = future = Future()
            if topic.replication_factor > self.brokers:  # as a broker answers
                error = KafkaError(
                    KafkaError.INVALID_REPLICATION_FACTOR,
                    f"Replication factor: {topic.replication_factor} larger than available "
                    f"brokers: {self.brokers}.",
                )
                future.set_exception(KafkaException(error))
                continue
            if topic.topic in self.topics:
                future.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS)))
                continue
            self.topics[topic.topic] = topic
            future.set_result(None)
        return futures

    def list_topics(self, *_: Any, **__: Any) -> Any:
        def meta(t: Any) -> Any:
            partitions = {
                p: SimpleNamespace(leader=0, replicas=list(range(t.replication_factor)))
                for p in range(t.num_partitions)
            }
            return SimpleNamespace(error=None, partitions=partitions)

        return SimpleNamespace(topics={name: meta(t) for name, t in self.topics.items()})

    def describe_configs(self, resources: list[Any], **_: Any) -> dict[Any, Future[Any]]:
        return {
            r: done({k: SimpleNamespace(value=v) for k, v in self.topics[r.name].config.items()})
            for r in resources
        }


def test_every_role_has_a_plan_and_a_documented_retention() -> None:
    plans = {p.role: p for p in plan_topics(NAMES, 6, 3)}
    assert tuple(plans) == ROLES
    assert set(DEFAULT_RETENTION_MS) == set(ROLES) - set(COMPACTED)
    for role in ("proposals", "transitions"):  # read from offset 0 by replay and verify
        assert plans[role].config["retention.ms"] == "-1"
        assert plans[role].config["retention.bytes"] == "-1"
    assert plans["rejections"].config["retention.ms"] == str(7 * DAY_MS)
    assert plans["alerts"].config["retention.ms"] == str(7 * DAY_MS)
    assert plans["dlq"].config["retention.ms"] == str(30 * DAY_MS)
    assert plans["heartbeats"].config["retention.ms"] == str(DAY_MS)
    for role in COMPACTED:
        assert plans[role].config["cleanup.policy"] == "compact"
        assert "retention.ms" not in plans[role].config
    assert plans["machines"].partitions == 1  # read whole, by every worker
    for role in set(ROLES) - set(COMPACTED):
        assert plans[role].config["cleanup.policy"] == "delete"
        if role not in ("proposals", "transitions"):
            assert "retention.bytes" not in plans[role].config


@pytest.mark.parametrize(
    ("brokers", "replication", "min_isr"),
    [(1, 1, None), (2, 2, "1"), (3, 3, "2"), (4, 3, "2"), (9, 3, "2")],
)
def test_replication_is_min_3_brokers_and_min_isr_follows(
    brokers: int, replication: int, min_isr: str | None
) -> None:
    cluster = FakeCluster(brokers)
    assert count_brokers(cluster) == brokers  # type: ignore[arg-type]
    assert default_replication(brokers) == replication
    plans, chosen, counted = resolve_plans(cluster, NAMES, TopicDefaults(partitions=4))  # type: ignore[arg-type]
    assert (chosen, counted) == (replication, brokers)
    for plan in plans:
        assert plan.replication == replication
        assert plan.partitions == (1 if plan.role == "machines" else 4)
        assert plan.config.get("min.insync.replicas") == min_isr


def test_min_insync_replicas_by_factor() -> None:
    assert [min_insync_replicas(rf) for rf in (1, 2, 3, 5)] == [None, 1, 2, 2]


def test_an_explicit_factor_wins_and_the_cluster_is_not_asked() -> None:
    cluster = FakeCluster(brokers=5)
    plans, chosen, counted = resolve_plans(cluster, NAMES, TopicDefaults(replication=2))  # type: ignore[arg-type]
    assert (chosen, counted, cluster.described) == (2, None, 0)
    assert {p.replication for p in plans} == {2}
    assert {p.config["min.insync.replicas"] for p in plans} == {"1"}


def test_provision_creates_with_the_defaults_then_finds_them() -> None:
    cluster = FakeCluster(brokers=3)
    defaults = TopicDefaults(partitions=2, retention_ms={"dlq": 3_600_000})
    done_ = provision_topics(cluster, NAMES, defaults)  # type: ignore[arg-type]
    assert set(done_.outcome.values()) == {"created"} and done_.replication == 3
    assert cluster.topics[NAMES.dlq].config["retention.ms"] == "3600000"
    assert cluster.topics[NAMES.changelog].replication_factor == 3
    assert cluster.topics[NAMES.proposals].config["min.insync.replicas"] == "2"


def test_parse_retention() -> None:
    assert parse_retention([]) == {}
    assert parse_retention(["dlq=1000", "proposals=-1", " alerts = 5 "]) == {
        "dlq": 1000,
        "proposals": FOREVER,
        "alerts": 5,
    }
    assert parse_retention(["dlq=1000", "dlq=1000"]) == {"dlq": 1000}
    refusals = {
        "changelog=1000": "compacted",
        "runs=1000": "roles: proposals, transitions, rejections, dlq, alerts, heartbeats",
        "dlq": "not ROLE=MS",
        "dlq=7d": "whole milliseconds",
        "dlq=0": "positive",
        "dlq=-2": "positive",
    }
    for item, message in refusals.items():
        with pytest.raises(TopicSettingError, match=message):
            parse_retention([item])
    with pytest.raises(TopicSettingError, match="twice"):
        parse_retention(["dlq=1", "dlq=2"])


def test_shortening_what_replay_and_verify_read_warns() -> None:
    assert retention_warnings({}) == []
    assert retention_warnings({"dlq": 1, "proposals": FOREVER}) == []
    proposals, transitions = retention_warnings({"proposals": DAY_MS, "transitions": DAY_MS})
    assert "proposals kept" in proposals and "verify" in proposals
    assert "transitions kept" in transitions and "replay" in transitions


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster(brokers=5)
    monkeypatch.setattr("processor.cli.topics.AdminClient", lambda _: fake)
    monkeypatch.setattr("processor.cli.options.reach", lambda settings, within_s: None)
    return fake


def test_cli_create_json_with_cluster_defaults(cluster: FakeCluster) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "topics",
            "create",
            "--json",
            "--partitions",
            "3",
            "--retention-ms",
            "dlq=3600000",
            "--retention-ms",
            "transitions=86400000",
        ],
    )
    assert result.exit_code == 0, result.output
    warning, _, body = result.output.partition("\n")
    assert warning.startswith("warning: transitions kept 86400000 ms (1 days)")
    summary = json.loads(body)
    assert summary["replication_factor"] == 3 and summary["brokers"] == 5
    assert summary["replication_from"] == "cluster" and summary["drift"] == []
    assert len(summary["warnings"]) == 1
    topics = {t["role"]: t for t in summary["topics"]}
    assert topics["dlq"]["config"]["retention.ms"] == "3600000"
    assert topics["transitions"]["config"]["retention.ms"] == "86400000"
    assert "retention.bytes" not in topics["transitions"]["config"]
    assert {t["outcome"] for t in topics.values()} == {"created"}
    assert {t["partitions"] for name, t in topics.items() if not name.endswith("machines")} == {3}
    assert cluster.topics["runstate.dlq"].replication_factor == 3

    # Describing with other settings than created: drift, exit 1, in JSON too.
    described = CliRunner().invoke(cli, ["topics", "describe", "--json", "--partitions", "3"])
    assert described.exit_code == 1
    drift = json.loads(described.output)["drift"]
    assert {(d["topic"], d["setting"]) for d in drift} == {
        ("runstate.dlq", "retention.ms"),
        ("runstate.transitions", "retention.ms"),
        ("runstate.transitions", "retention.bytes"),
    }


def test_cli_text_names_where_the_factor_came_from(cluster: FakeCluster) -> None:
    created = CliRunner().invoke(cli, ["topics", "create"])
    assert created.exit_code == 0, created.output
    assert created.output.startswith(
        "replication factor 3 (min(3, brokers): the cluster has 5 brokers)\n"
    )
    assert "runstate.proposals: created" in created.output
    given = CliRunner().invoke(
        cli, ["topics", "describe", "--json"], env={"RUNSTATE_REPLICATION_FACTOR": "2"}
    )
    summary = json.loads(given.output)
    assert (summary["replication_factor"], summary["replication_from"]) == (2, "flag")
    assert given.exit_code == 1  # created at 3
    assert {d["setting"] for d in summary["drift"]} == {
        "replication factor",
        "min.insync.replicas",
    }


def test_cli_retention_from_the_environment(cluster: FakeCluster) -> None:
    result = CliRunner().invoke(
        cli,
        ["topics", "create", "--json"],
        env={"RUNSTATE_RETENTION_MS": "dlq=1000 alerts=2000"},
    )
    assert result.exit_code == 0, result.output
    topics = {t["role"]: t for t in json.loads(result.output)["topics"]}
    assert topics["dlq"]["config"]["retention.ms"] == "1000"
    assert topics["alerts"]["config"]["retention.ms"] == "2000"


@pytest.mark.parametrize("command", [["topics", "create"], ["topics", "describe"], ["replay"]])
def test_cli_refuses_a_retention_for_the_changelog_before_kafka(command: list[str]) -> None:
    result = CliRunner().invoke(
        cli, [*command, "--retention-ms", "changelog=1000", "--bootstrap-servers", "127.0.0.1:1"]
    )
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--retention-ms'" in result.output
    assert "the changelog is compacted" in result.output


@pytest.mark.parametrize("command", [["topics", "create"], ["topics", "describe"], ["replay"]])
def test_help_names_the_topic_settings(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for text in (
        "--replication-factor",
        "RUNSTATE_REPLICATION_FACTOR",
        "min(3, the brokers in the cluster)",
        "--retention-ms ROLE=MS",
        "RUNSTATE_RETENTION_MS",
    ):
        assert text in result.output, text


def test_cli_a_factor_over_the_brokers_is_a_clear_error(cluster: FakeCluster) -> None:
    result = CliRunner().invoke(cli, ["topics", "create", "--replication-factor", "7"])
    assert result.exit_code == 1
    assert "runstate.proposals: the cluster cannot hold 7 replicas of a partition" in (
        result.output
    )
    assert "larger than available brokers: 5" in result.output
    assert "--replication-factor no larger than its brokers" in result.output
    again = CliRunner().invoke(cli, ["topics", "create", "--json"])
    assert again.exit_code == 0
    assert CliRunner().invoke(cli, ["topics", "create"]).output.count(": exists") == len(ROLES)
