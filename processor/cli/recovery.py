"""`runstate replay` and `runstate verify`: recovery and audit by replaying offsets."""

import os
import shutil
import sys
from datetime import datetime
from pathlib import Path

import click
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from processor.audit import Finding, verify_partition, verify_runs_across_partitions
from processor.cli.options import (
    group_id_option,
    kafka_options,
    keyring_file_option,
    machine_path_option,
    max_proposal_bytes_option,
    max_state_bytes_option,
    option,
    state_dir_option,
)
from processor.config import KafkaSettings
from processor.engine import Machine
from processor.engine.parse import MachineFileError
from processor.keyring import KeyringError, load_keyring
from processor.machines import load_catalog
from processor.readback import offset_for_time, read_partition, read_partitions
from processor.replay import apply_transitions
from processor.runtime.statedir import StateDir, StateDirBusy
from processor.runtime.store import PartitionStore
from processor.topics import TopicNames, create_topics, plan_topics
from schemas.messages import Transition


def parse_time(text: str) -> int:
    """Milliseconds since the epoch, from digits (ms) or an ISO-8601 time."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter(
            f"'{text}' is neither epoch milliseconds nor ISO-8601 (2026-11-29T10:00:00Z)"
        ) from exc
    if moment.tzinfo is None:
        raise click.BadParameter(f"'{text}' has no time zone; add Z or +01:00")
    return int(moment.timestamp() * 1000)


def _catalog(paths: tuple[Path, ...]) -> dict[str, Machine]:
    try:
        return load_catalog(paths)
    except MachineFileError as exc:
        raise click.ClickException(f"cannot load machines:\n{exc}") from exc


def _partitions(settings: KafkaSettings, topic: str) -> int:
    meta = AdminClient(settings.client()).list_topics(topic, timeout=30).topics.get(topic)
    if meta is None or meta.error is not None:
        raise click.ClickException(f"topic {topic} does not exist")
    return len(meta.partitions)


@click.command()
@kafka_options
@group_id_option
@state_dir_option
@machine_path_option
@option(
    "--from-time",
    env="REPLAY_FROM_TIME",
    default=None,
    help="Apply transitions from this time (epoch ms or ISO-8601) onto the stores as they "
    "are (e.g. restored from a backup taken then); default: rebuild from offset 0.",
)
@option("--force", env="REPLAY_FORCE", is_flag=True, help="Replace existing stores.")
def replay(
    bootstrap_servers: str | None,
    kafka_settings: tuple[str, ...],
    topic_prefix: str,
    group_id: str,
    state_dir: Path,
    machine_paths: tuple[Path, ...],
    from_time: str | None,
    force: bool,
) -> None:
    """Rebuild every partition store from the transitions topic.

    For when a worker's local state and the changelog are both gone: each transition is
    decided again from the snapshot before it and must come out identical. The rebuilt
    snapshots go into the stores under --state-dir and back into the changelog (which
    is created if missing). Stop the worker using --state-dir first.
    """
    console = Console()
    settings = KafkaSettings.resolve(bootstrap_servers, kafka_settings)
    topics = TopicNames.with_prefix(topic_prefix)
    machines = _catalog(machine_paths)
    since = parse_time(from_time) if from_time else None
    partitions = _partitions(settings, topics.proposals)
    create_topics(AdminClient(settings.client()), plan_topics(topics, partitions, 1))
    try:
        state = StateDir(state_dir, group_id, topics.proposals).claim()
    except StateDirBusy as exc:
        raise click.ClickException(str(exc)) from exc
    producer = Producer(settings.client({"transactional.id": f"{group_id}-replay-{os.getpid()}"}))
    producer.init_transactions(60)
    table = Table("partition", "transitions read", "applied", "runs", "problems")
    problems = 0
    try:
        with Progress(console=console) as progress:
            task = progress.add_task("Replaying transitions", total=partitions)
            for p in range(partitions):
                path = state.partition(p)
                if since is None and path.exists():
                    if not force:
                        raise click.ClickException(
                            f"{path} exists; pass --force to rebuild it from offset 0, or "
                            "--from-time to continue it"
                        )
                    shutil.rmtree(path)
                store = PartitionStore(path)
                try:
                    start = {s.run_id: s for s in store.runs()} if since is not None else {}
                    first = (
                        offset_for_time(settings, topics.transitions, p, since)
                        if since is not None
                        else 0
                    )
                    records = read_partition(settings, topics.transitions, p, first)
                    pairs = [
                        (Transition.model_validate_json(r.value or b""), r.offset) for r in records
                    ]
                    result = apply_transitions(machines, pairs, start)
                    changed = {t.run_id for t, _ in pairs}
                    snapshots = [
                        (run_id.encode(), result.snapshots[run_id].model_dump_json().encode())
                        for run_id in sorted(changed)
                        if run_id in result.snapshots
                    ]
                    end = (records[-1].offset + 1) if records else first
                    changelog_end = _republish(producer, topics.changelog, p, snapshots)
                    offsets = {topics.transitions: end}
                    if changelog_end is not None:
                        offsets[topics.changelog] = changelog_end
                    history = [
                        (t.run_id.encode(), r.value or b"")
                        for (t, _), r in zip(pairs, records, strict=True)
                    ]
                    store.restore(snapshots, history, offsets)
                finally:
                    store.close()
                for problem in result.problems:
                    console.print(f"[red]problem[/] {problem}")
                problems += len(result.problems)
                table.add_row(
                    str(p),
                    str(len(records)),
                    str(result.applied),
                    str(len(snapshots)),
                    str(len(result.problems)),
                )
                progress.advance(task)
    except KafkaException as exc:
        raise click.ClickException(f"{exc}; is the broker up?") from exc
    finally:
        state.release()
    console.print(table)
    if problems:
        console.print(f"[red]{problems} transitions could not be replayed[/]")
        sys.exit(1)
    console.print(
        f"stores rebuilt under {state.root}; start the worker with --state-dir {state_dir}"
    )


def _republish(
    producer: Producer, topic: str, partition: int, snapshots: list[tuple[bytes, bytes]]
) -> int | None:
    """Write the snapshots to the changelog in one transaction; the next offset after."""
    if not snapshots:
        return None
    last = [-1]

    def delivered(err: object, msg: object) -> None:
        if err is None:
            last[0] = max(last[0], msg.offset())  # type: ignore[attr-defined]

    producer.begin_transaction()
    for key, value in snapshots:
        producer.produce(topic, key=key, value=value, partition=partition, on_delivery=delivered)
        producer.poll(0)
    producer.commit_transaction(60)
    producer.flush(30)
    return last[0] + 1


@click.command()
@kafka_options
@keyring_file_option
@machine_path_option
@max_proposal_bytes_option
@max_state_bytes_option
def verify(
    bootstrap_servers: str | None,
    kafka_settings: tuple[str, ...],
    topic_prefix: str,
    keyring_file: Path | None,
    machine_paths: tuple[Path, ...],
    max_proposal_bytes: int,
    max_state_bytes: int,
) -> None:
    """Check the transitions topic against the proposals topic, record by record.

    Replays every proposal through the decision engine (with the workers' keyring and
    machines), compares the commits with the transitions topic, recomputes every hash
    and follows every run's chain. Exit 1 and name the offset of each difference.
    """
    console = Console()
    settings = KafkaSettings.resolve(bootstrap_servers, kafka_settings)
    topics = TopicNames.with_prefix(topic_prefix)
    machines = _catalog(machine_paths)
    try:
        keyring = load_keyring(keyring_file, os.environ.get("RUNSTATE_KEYRING"))
    except KeyringError as exc:
        raise click.ClickException(str(exc)) from exc
    partitions = _partitions(settings, topics.proposals)
    with console.status("Reading the proposals and transitions topics"):
        proposals = read_partitions(settings, topics.proposals)
        transitions = read_partitions(settings, topics.transitions)
    findings: list[Finding] = []
    checked = 0
    with Progress(console=console) as progress:
        task = progress.add_task("Verifying partitions", total=partitions)
        for p in range(partitions):
            findings += verify_partition(
                p,
                proposals.get(p, []),
                transitions.get(p, []),
                machines=machines,
                keyring=keyring,
                max_bytes=max_proposal_bytes,
                max_state_bytes=max_state_bytes,
            )
            checked += len(transitions.get(p, []))
            progress.advance(task)
    findings += verify_runs_across_partitions(transitions)
    if findings:
        for finding in findings:
            console.print(f"[red]DIFFERENCE[/] {finding}")
        console.print(f"{len(findings)} differences in {checked} transitions")
        sys.exit(1)
    console.print(
        f"verified {checked} transitions against "
        f"{sum(len(v) for v in proposals.values())} proposals in {partitions} partitions: "
        "every transition follows from the proposals and every chain is intact"
    )
