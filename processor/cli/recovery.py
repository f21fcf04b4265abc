"""`runstate replay` and `runstate verify`: recovery and audit by replaying offsets."""

import dataclasses
import json
import os
import sys
from pathlib import Path

import click
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from processor.cli.machines import catalog_with_versions, optional_keyring, versions_and_refusals
from processor.cli.options import (
    KafkaContext,
    group_id_option,
    keyring_file_option,
    machine_path_option,
    max_proposal_bytes_option,
    max_state_bytes_option,
    option,
    pass_kafka,
    state_dir_option,
)
from processor.cli.topics import topic_settings
from processor.history.rebuild import RebuildError, StoresExist, partition_count, rebuild_stores
from processor.history.verify import verify_topics
from processor.kafka.readback import read_partitions
from processor.kafka.topic_plans import TopicDefaults, TopicSettingError
from processor.records.outputs import CommitLimits
from processor.runtimes.native.preflight import learn_limits
from processor.runtimes.native.statedir import StateDirBusy
from processor.times import parse_time
from processor.trust.keyring import KeyringError, load_keyring


@click.command()
@pass_kafka
@group_id_option
@state_dir_option
@machine_path_option
@keyring_file_option
@option(
    "--from-time",
    env="REPLAY_FROM_TIME",
    default=None,
    help="Apply transitions from this time (epoch ms or ISO-8601) onto the stores as they "
    "are (e.g. restored from a backup taken then); default: rebuild from offset 0.",
)
@option("--force", env="REPLAY_FORCE", is_flag=True, help="Replace existing stores.")
@topic_settings
def replay(
    kafka: KafkaContext,
    group_id: str,
    state_dir: Path,
    machine_paths: tuple[Path, ...],
    keyring_file: Path | None,
    from_time: str | None,
    force: bool,
    topic_defaults: TopicDefaults,
) -> None:
    """Rebuild every partition store from the transitions topic.

    For when a worker's local state and the changelog are both gone: each transition is
    decided again from the snapshot before it and must come out identical. The rebuilt
    snapshots go into the stores under --state-dir and back into the changelog (which
    is created if missing, with the settings of `topics create`: --replication-factor,
    default min(3, brokers)). Stop the worker using --state-dir first.
    """
    console = Console()
    # The workers' keyring checks the operators' signatures on the machines topic's
    # versions; without one, only the versions held here decide.
    machines = catalog_with_versions(machine_paths, kafka, optional_keyring(keyring_file))
    try:
        since = parse_time(from_time) if from_time else None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    table = Table("partition", "transitions read", "applied", "runs", "problems")
    problems = 0
    try:
        with (
            rebuild_stores(
                kafka.settings,
                kafka.topics,
                machines,
                state_dir,
                group_id,
                since_ms=since,
                replace=force,
                topic_defaults=topic_defaults,
            ) as rebuild,
            Progress(console=console) as progress,
        ):
            task = progress.add_task("Replaying transitions", total=rebuild.partitions)
            for p in range(rebuild.partitions):
                done = rebuild.partition(p)
                for problem in done.result.problems:
                    console.print(f"[red]problem[/] {problem}")
                problems += len(done.result.problems)
                table.add_row(
                    str(p),
                    str(done.read),
                    str(done.result.applied),
                    str(done.runs),
                    str(len(done.result.problems)),
                )
                progress.advance(task)
            root = rebuild.root
    except StoresExist as exc:
        raise click.ClickException(
            f"{exc}; pass --force to rebuild them from offset 0, or --from-time to continue them"
        ) from exc
    except (RebuildError, StateDirBusy, TopicSettingError) as exc:
        raise click.ClickException(str(exc)) from exc
    except KafkaException as exc:
        raise click.ClickException(f"{exc}; is the broker up?") from exc
    console.print(table)
    if problems:
        console.print(f"[red]{problems} transitions could not be replayed[/]")
        sys.exit(1)
    console.print(f"stores rebuilt under {root}; start the worker with --state-dir {state_dir}")


@click.command()
@pass_kafka
@keyring_file_option
@machine_path_option
@max_proposal_bytes_option
@max_state_bytes_option
@option(
    "--json",
    "as_json",
    env="VERIFY_JSON",
    is_flag=True,
    help='Print one JSON object for scripts: {"transitions": n, "differences": '
    '[{"partition", "offset", "detail", "topic"}]} (topic: transitions, or machines for '
    "a machine version that takes no effect; exit 1 when there are differences).",
)
def verify(
    kafka: KafkaContext,
    keyring_file: Path | None,
    machine_paths: tuple[Path, ...],
    max_proposal_bytes: int,
    max_state_bytes: int,
    as_json: bool,
) -> None:
    """Check the transitions topic against the proposals topic, record by record.

    Replays every proposal through the decision engine (with the workers' keyring and
    machines), compares the commits with the transitions topic, recomputes every hash
    and follows every run's chain; every version on the machines topic must be signed
    by an operator's key (or be one held here: a built-in machine, one of its earlier
    versions, a --machine-path file), and every committed `migrate` proposed with an
    operator's key. Exit 1 and name the offset of each difference.
    """
    console = Console(stderr=as_json)
    # The keyring first: one that does not load stops `verify` before it reads anything.
    try:
        keyring = load_keyring(keyring_file, os.environ.get("RUNSTATE_KEYRING"))
    except KeyringError as exc:
        raise click.ClickException(str(exc)) from exc
    settings, topics = kafka.settings, kafka.topics
    machines, refused = versions_and_refusals(machine_paths, kafka, keyring)
    try:
        partitions = partition_count(settings, topics.proposals)
    except RebuildError as exc:
        raise click.ClickException(str(exc)) from exc
    # The topics' limits as they are: a commit the workers refused because one batch of a
    # topic could not hold its records is refused here too.
    try:
        limits = learn_limits(AdminClient(settings.client()), settings, topics)
    except KafkaException as exc:
        raise click.ClickException(
            f"cannot read the topics' max.message.bytes ({exc}); run `runstate topics create`"
        ) from exc
    with console.status("Reading the proposals and transitions topics"):
        proposals = read_partitions(settings, topics.proposals)
        transitions = read_partitions(settings, topics.transitions)
    with Progress(console=console) as progress:
        task = progress.add_task("Verifying partitions", total=partitions)
        result = verify_topics(
            proposals,
            transitions,
            partitions=partitions,
            topic=topics.proposals,
            machines=machines,
            keyring=keyring,
            max_bytes=max_proposal_bytes,
            max_state_bytes=max_state_bytes,
            commit_limits=CommitLimits(topics, limits),
            refused=refused,
            on_partition=lambda _: progress.advance(task),
        )
    findings, checked = result.findings, result.transitions
    if as_json:
        found = [dataclasses.asdict(f) for f in findings]
        click.echo(json.dumps({"transitions": checked, "differences": found}))
        sys.exit(1 if findings else 0)
    if findings:
        for finding in findings:
            console.print(f"[red]DIFFERENCE[/] {finding}")
        console.print(f"{len(findings)} differences in {checked} transitions")
        sys.exit(1)
    console.print(
        f"verified {checked} transitions against "
        f"{result.proposals} proposals in {partitions} partitions: "
        "every transition follows from the proposals and every chain is intact"
    )
