"""`runstate topics`: create the topics with the right settings, and report drift."""

import click
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.table import Table

from processor.cli.options import KafkaContext, option, pass_kafka
from processor.topics import Drift, TopicPlan, create_topics, describe_topics, plan_topics

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
    default=1,
    help="Replication factor of every topic (3 on a production cluster).",
)


def _setup(kafka: KafkaContext, partitions: int, rf: int) -> tuple[AdminClient, list[TopicPlan]]:
    return AdminClient(kafka.settings.client()), plan_topics(kafka.topics, partitions, rf)


@click.group()
def topics() -> None:
    """The proposals, transitions, rejections, DLQ and changelog topics."""


@topics.command()
@pass_kafka
@partitions_option
@replication_option
def create(kafka: KafkaContext, partitions: int, replication_factor: int) -> None:
    """Create the missing topics (idempotent), then report any drift of existing ones."""
    admin, plans = _setup(kafka, partitions, replication_factor)
    try:
        outcome = create_topics(admin, plans)
        drift = describe_topics(admin, plans)
    except KafkaException as exc:
        raise click.ClickException(f"{exc}; is the broker at the bootstrap address up?") from exc
    for plan in plans:
        click.echo(f"{plan.name}: {outcome[plan.name]}")
    _report(drift)


@topics.command()
@pass_kafka
@partitions_option
@replication_option
def describe(kafka: KafkaContext, partitions: int, replication_factor: int) -> None:
    """Show each topic's expected settings; exit 1 if the cluster differs from them."""
    admin, plans = _setup(kafka, partitions, replication_factor)
    try:
        drift = describe_topics(admin, plans)
    except KafkaException as exc:
        raise click.ClickException(f"{exc}; is the broker at the bootstrap address up?") from exc
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
