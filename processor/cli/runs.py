"""`runstate create|propose|get|history|stats|tail`: work with runs from a shell."""

import json
import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from processor.cli.machines import catalog_with_versions, optional_keyring
from processor.cli.options import (
    KafkaContext,
    http_token_option,
    keyring_file_option,
    machine_path_option,
    option,
    pass_kafka,
    worker_url_option,
)
from processor.client import (
    InvalidArgument,
    NotFound,
    OutcomeTimeout,
    RunReader,
    RunstateClient,
    Unavailable,
)
from processor.history.rebuild import RebuildError, run_as_of
from processor.kafka.readback import TopicUnavailable, follow
from processor.times import duration, now_ms, parse_time
from processor.trust.keyring import KeyringError, load_keyring, load_signing_key, signing_key_from
from schemas.messages import Rejection

key_id_option = option(
    "--key-id",
    env="KEY_ID",
    default="runtime",
    help="Which HMAC key of the keyring signs (it decides your authority); "
    "--signing-key-file instead for an ed25519 key.",
)
signing_key_file_option = option(
    "--signing-key-file",
    env="SIGNING_KEY_FILE",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Your signing key (`runstate keys add` writes one); its key id decides your "
    "authority. Used instead of --keyring-file and --key-id.",
)
wait_option = option(
    "--wait/--no-wait",
    env="WAIT",
    default=True,
    help="Wait for the outcome and print it; exit 1 on a rejection.",
)
timeout_option = option(
    "--timeout", env="TIMEOUT", type=float, default=30.0, help="Seconds to wait for an outcome."
)


def _client(
    kafka: KafkaContext, keyring_file: Path | None, key_id: str, signing_key_file: Path | None
) -> RunstateClient:
    try:
        if signing_key_file is not None:
            signing = load_signing_key(signing_key_file)
        else:
            keyring = load_keyring(keyring_file, os.environ.get("RUNSTATE_KEYRING"))
            signing = signing_key_from(keyring, key_id)
    except KeyringError as exc:
        raise click.ClickException(str(exc)) from exc
    return RunstateClient(kafka.settings, kafka.topics, signing_key=signing)


def _finish(client: RunstateClient, proposal_id: str, wait: bool, timeout: float) -> None:
    try:
        client.flush(timeout)
    except (NotFound, Unavailable) as exc:
        raise click.ClickException(str(exc)) from exc
    if not wait:
        click.echo(json.dumps({"proposal_id": proposal_id}))
        return
    try:
        outcome = client.wait(proposal_id, timeout)
    except (NotFound, OutcomeTimeout, Unavailable) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        client.close()
    click.echo(outcome.model_dump_json())
    if isinstance(outcome, Rejection):
        sys.exit(1)


@click.command()
@click.argument("run_id")
@click.argument("machine")
@option("--max-retries", env="MAX_RETRIES", type=int, default=None, help="Retry budget.")
@option(
    "--success-criterion",
    "success_criteria",
    env="SUCCESS_CRITERIA",
    multiple=True,
    help="A fact that must be recorded before completion (repeatable).",
)
@option("--proposal-id", env="PROPOSAL_ID", default=None, help="Give one to retry safely.")
@pass_kafka
@keyring_file_option
@key_id_option
@signing_key_file_option
@wait_option
@timeout_option
def create(
    run_id: str,
    machine: str,
    max_retries: int | None,
    success_criteria: tuple[str, ...],
    proposal_id: str | None,
    kafka: KafkaContext,
    keyring_file: Path | None,
    key_id: str,
    signing_key_file: Path | None,
    wait: bool,
    timeout: float,
) -> None:
    """Create run RUN_ID on MACHINE (revision 0 in the machine's initial state)."""
    client = _client(kafka, keyring_file, key_id, signing_key_file)
    try:
        pid = client.create(
            run_id,
            machine,
            max_retries=max_retries,
            success_criteria=list(success_criteria) or None,
            proposal_id=proposal_id,
            timeout=timeout,
        )
    except InvalidArgument as exc:
        client.close()
        raise click.UsageError(str(exc)) from None
    except (NotFound, Unavailable) as exc:
        raise click.ClickException(str(exc)) from exc
    _finish(client, pid, wait, timeout)


@click.command()
@click.argument("run_id")
@click.argument("event")
@option("--payload", env="PAYLOAD", default=None, help="Event payload as a JSON object.")
@option("--reason", env="REASON", default=None, help="Reason, where the machine needs one.")
@option("--expected-revision", env="EXPECTED_REVISION", type=int, default=None, help="CAS check.")
@option("--proposal-id", env="PROPOSAL_ID", default=None, help="Give one to retry safely.")
@pass_kafka
@keyring_file_option
@key_id_option
@signing_key_file_option
@wait_option
@timeout_option
def propose(
    run_id: str,
    event: str,
    payload: str | None,
    reason: str | None,
    expected_revision: int | None,
    proposal_id: str | None,
    kafka: KafkaContext,
    keyring_file: Path | None,
    key_id: str,
    signing_key_file: Path | None,
    wait: bool,
    timeout: float,
) -> None:
    """Propose EVENT for run RUN_ID, signed with --key-id; print the outcome."""
    try:
        data: Any = json.loads(payload) if payload else {}
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from exc
    if not isinstance(data, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--payload")
    client = _client(kafka, keyring_file, key_id, signing_key_file)
    try:
        pid = client.propose(
            run_id,
            event,
            payload=data,
            reason=reason,
            expected_revision=expected_revision,
            proposal_id=proposal_id,
            timeout=timeout,
        )
    except InvalidArgument as exc:
        client.close()
        raise click.UsageError(str(exc)) from None
    except (NotFound, Unavailable) as exc:
        raise click.ClickException(str(exc)) from exc
    _finish(client, pid, wait, timeout)


def _reader(worker_urls: tuple[str, ...], http_token: str | None) -> RunReader:
    try:
        return RunReader(worker_urls, http_token=http_token)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc), param_hint="--worker-url") from None


@click.command()
@click.argument("run_id")
@worker_url_option
@http_token_option
@option(
    "--at",
    "at_time",
    env="AT",
    default=None,
    help="The run as it stood at this time (epoch ms or ISO-8601), rebuilt from the "
    "transitions topic instead of asked from a worker.",
)
@option(
    "--at-offset",
    env="AT_OFFSET",
    type=int,
    default=None,
    help="The run as it stood after this offset of its transitions partition.",
)
@pass_kafka
@machine_path_option
@keyring_file_option
def get(
    run_id: str,
    worker_urls: tuple[str, ...],
    http_token: str | None,
    at_time: str | None,
    at_offset: int | None,
    kafka: KafkaContext,
    machine_paths: tuple[Path, ...],
    keyring_file: Path | None,
) -> None:
    """Print run RUN_ID's committed snapshot (JSON): now, from a worker's HTTP API, or
    as it stood at a time or offset, replayed from the transitions topic."""
    if at_time is None and at_offset is None:
        try:
            snapshot = _reader(worker_urls, http_token).snapshot(run_id)
        except (LookupError, Unavailable) as exc:
            raise click.ClickException(str(exc)) from exc
    else:
        try:
            at_ms = None if at_time is None else parse_time(at_time)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc
        # The keyring checks the operators' signatures on the machines topic's versions.
        keyring = optional_keyring(keyring_file)
        machines = catalog_with_versions(machine_paths, kafka, keyring)
        try:
            snapshot = run_as_of(
                kafka.settings, kafka.topics, machines, run_id, at_ms=at_ms, at_offset=at_offset
            )
        except RebuildError as exc:
            raise click.ClickException(str(exc)) from exc
    if snapshot is None:
        raise click.ClickException(f"no run '{run_id}' (at that point)")
    click.echo(snapshot.model_dump_json(indent=2))


@click.command()
@click.argument("run_id")
@worker_url_option
@http_token_option
def history(run_id: str, worker_urls: tuple[str, ...], http_token: str | None) -> None:
    """Print run RUN_ID's transitions as JSON lines, oldest first."""
    try:
        transitions = _reader(worker_urls, http_token).history(run_id)
    except (LookupError, Unavailable) as exc:
        raise click.ClickException(str(exc)) from exc
    for transition in transitions:
        click.echo(transition.model_dump_json())


@click.command()
@click.argument(
    "what", type=click.Choice(["transitions", "rejections", "dlq"]), default="transitions"
)
@option("--from-beginning", env="FROM_BEGINNING", is_flag=True, help="Start at offset 0.")
@option("--limit", env="TAIL_LIMIT", type=int, default=0, help="Stop after this many (0: follow).")
@pass_kafka
def tail(what: str, from_beginning: bool, limit: int, kafka: KafkaContext) -> None:
    """Follow transitions, rejections or DLQ records as JSON lines (read_committed)."""
    topics = kafka.topics
    topic = {"transitions": topics.transitions, "rejections": topics.rejections}.get(
        what, topics.dlq
    )
    try:
        follower = follow(kafka.settings, topic, from_beginning=from_beginning, limit=limit or None)
    except TopicUnavailable as exc:
        raise click.ClickException(f"{exc}; run `runstate topics create`?") from exc
    with follower:
        try:
            for value in follower:
                click.echo(value.decode())
        except KeyboardInterrupt:
            pass


@click.command()
@worker_url_option
@http_token_option
@option("--state", env="STATE", default=None, help="List the runs in this state instead.")
@option("--machine", env="MACHINE", default=None, help="With --state: only this machine's.")
@option(
    "--limit", env="STATS_LIMIT", type=click.IntRange(1, 1000), default=20, help="With --state."
)
@option("--json", "as_json", env="STATS_JSON", is_flag=True, help="Print the answer as JSON.")
def stats(
    worker_urls: tuple[str, ...],
    http_token: str | None,
    state: str | None,
    machine: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """How many runs are in each state across the cluster, and how long the oldest has
    waited there (any worker answers for all); with --state, those runs, longest first.
    --json prints the workers' answer as it is: {"states": [...]} or {"runs": [...],
    "next": ...}, each with "missing_partitions"."""
    reader = _reader(worker_urls, http_token)
    now = now_ms()
    try:
        data = reader.stats() if state is None else reader.runs_in_state(state, machine, limit)
    except (LookupError, ValueError, Unavailable) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(data))
        return
    console = Console()
    if state is None:
        table = Table("machine", "state", "runs", "longest in state")
        for row in data["states"]:
            oldest = row["oldest_entered_ms"]
            longest = "" if oldest is None else duration(now - oldest)
            table.add_row(row["machine"], row["state"], f"{row['runs']:,}", longest)
    else:
        table = Table("run", "machine", "state", "in state for")
        for run in data["runs"]:
            table.add_row(
                run["run_id"], run["machine"], run["state"], duration(run["time_in_state_ms"])
            )
    console.print(table)
    if data.get("next"):
        console.print(f"more: --state {state} (next page: after={data['next']})")
    if data["missing_partitions"]:
        console.print(
            f"[red]partitions {data['missing_partitions']} did not answer[/] (their workers are "
            "down or rebalancing): these figures leave them out"
        )
