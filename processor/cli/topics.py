"""`runstate topics`: create the topics with the right settings, and report drift."""

import functools
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import click
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.table import Table

from processor.cli.options import KafkaContext, option, pass_kafka
from processor.kafka.topic_checks import Drift, describe_topics
from processor.kafka.topic_creation import create_topics, resolve_plans
from processor.kafka.topic_plans import (
    DEFAULT_RETENTION_MS,
    TopicDefaults,
    TopicPlan,
    TopicSettingError,
    parse_retention,
    retention_warnings,
)

partitions_option = option(
    "--partitions",
    env="PARTITIONS",
    type=click.IntRange(min=1),
    default=6,
    help="Partitions of every topic (the proposals' count is the unit of parallelism).",
)
replication_option = option(
    "--replication-factor",
    env="REPLICATION_FACTOR",
    type=click.IntRange(min=1),
    default=None,
    help="Replication factor of every topic. Default: min(3, the brokers in the cluster), "
    "the live ones counted: 3 on a cluster of three (`runstate broker start --brokers 3`); "
    "with a broker down, give it. min.insync.replicas follows it: 2 at a factor of 3 or "
    "more, 1 at a factor of 2 (so one broker down does not stop the producers), the "
    "broker's own at 1.",
)
retention_option = option(
    "--retention-ms",
    "retention",
    env="RETENTION_MS",
    multiple=True,
    metavar="ROLE=MS",
    help="Retention of one topic in milliseconds (-1: forever), repeatable; roles: "
    f"{', '.join(DEFAULT_RETENTION_MS)}. Defaults: proposals and transitions forever "
    "(replay and verify read them from offset 0: shortening them warns), rejections and "
    "alerts 7 days, dlq 30 days, heartbeats 1 day. The changelog and the machines topic "
    "are compacted and take none. In the environment, separate items with spaces.",
)
json_option = option(
    "--json", "as_json", env="TOPICS_JSON", is_flag=True, help="Print one JSON object."
)


def topic_settings(command: Callable[..., Any]) -> Callable[..., Any]:
    """--replication-factor and --retention-ms, passed to the command as one
    `topic_defaults: TopicDefaults` (its partitions left to the command). A nonsense
    retention is a usage error; a shortened proposals or transitions topic a warning."""

    @functools.wraps(command)
    def resolved(
        *args: Any, replication_factor: int | None, retention: tuple[str, ...], **kwargs: Any
    ) -> Any:
        try:
            retention_ms = parse_retention(retention)
        except TopicSettingError as exc:
            raise click.BadParameter(str(exc), param_hint="'--retention-ms'") from exc
        for warning in retention_warnings(retention_ms):
            click.echo(f"warning: {warning}", err=True)
        defaults = TopicDefaults(replication=replication_factor, retention_ms=retention_ms)
        return command(*args, topic_defaults=defaults, **kwargs)

    return replication_option(retention_option(resolved))  # type: ignore[no-any-return]


@click.group()
def topics() -> None:
    """The proposals, transitions, rejections, DLQ, changelog, alerts, heartbeats and
    machines topics."""


def _plans(
    kafka: KafkaContext, defaults: TopicDefaults
) -> tuple[AdminClient, list[TopicPlan], int, int | None]:
    admin = AdminClient(kafka.settings.client())
    plans, replication, brokers = resolve_plans(admin, kafka.topics, defaults)
    return admin, plans, replication, brokers


def _replication_line(replication: int, brokers: int | None) -> str:
    why = (
        "given"
        if brokers is None
        else f"min(3, brokers): the cluster has {brokers} broker{'s' * (brokers != 1)}"
    )
    return f"replication factor {replication} ({why})"


def _summary(
    plans: list[TopicPlan],
    replication: int,
    brokers: int | None,
    drift: list[Drift],
    defaults: TopicDefaults,
    outcome: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "replication_factor": replication,
        "replication_from": "flag" if brokers is None else "cluster",
        "brokers": brokers,
        "topics": [
            {
                "name": p.name,
                "role": p.role,
                "partitions": p.partitions,
                "replication": p.replication,
                "config": p.config,
                **({"outcome": outcome[p.name]} if outcome is not None else {}),
            }
            for p in plans
        ],
        "drift": [d.__dict__ for d in drift],
        "warnings": retention_warnings(defaults.retention_ms),
    }


@topics.command()
@pass_kafka
@partitions_option
@topic_settings
@json_option
def create(
    kafka: KafkaContext, partitions: int, topic_defaults: TopicDefaults, as_json: bool
) -> None:
    """Create the missing topics (idempotent), then report any drift of existing ones.

    Prints each topic's outcome (created or exists); --json one object with the
    replication factor and where it came from, each topic's settings and outcome, the
    drift and the warnings. Exit 1 on drift (an existing topic that differs is not
    changed: a replication factor, for one, takes a partition reassignment).
    """
    defaults = replace(topic_defaults, partitions=partitions)
    try:
        admin, plans, replication, brokers = _plans(kafka, defaults)
        outcome = create_topics(admin, plans)
        drift = describe_topics(admin, plans)
    except TopicSettingError as exc:
        raise click.ClickException(str(exc)) from exc
    except KafkaException as exc:
        raise click.ClickException(f"{exc}; is the broker at the bootstrap address up?") from exc
    if as_json:
        summary = _summary(plans, replication, brokers, drift, defaults, outcome)
        click.echo(json.dumps(summary, indent=2))
        raise SystemExit(1 if drift else 0)
    click.echo(_replication_line(replication, brokers))
    for plan in plans:
        click.echo(f"{plan.name}: {outcome[plan.name]}")
    _report(drift)


@topics.command()
@pass_kafka
@partitions_option
@topic_settings
@json_option
def describe(
    kafka: KafkaContext, partitions: int, topic_defaults: TopicDefaults, as_json: bool
) -> None:
    """Show each topic's expected settings; exit 1 if the cluster differs from them.

    The same defaults as `topics create` (the replication factor from the cluster's
    brokers unless given); --json one object like create's, without outcomes.
    """
    defaults = replace(topic_defaults, partitions=partitions)
    try:
        admin, plans, replication, brokers = _plans(kafka, defaults)
        drift = describe_topics(admin, plans)
    except KafkaException as exc:
        raise click.ClickException(f"{exc}; is the broker at the bootstrap address up?") from exc
    if as_json:
        click.echo(json.dumps(_summary(plans, replication, brokers, drift, defaults), indent=2))
        raise SystemExit(1 if drift else 0)
    click.echo(_replication_line(replication, brokers))
    table = Table("topic", "role", "partitions", "replication", "settings")
    for plan in plans:
        settings = ", ".join(f"{k}={v}" for k, v in plan.config.items())
        table.add_row(plan.name, plan.role, str(plan.partitions), str(plan.replication), settings)
    Console().print(table)
    _report(drift)


def _report(drift: list[Drift]) -> None:
    if not drift:
        click.echo("all topics match the expected settings")
        return
    for item in drift:
        click.echo(f"drift: {item}", err=True)
    raise SystemExit(1)
