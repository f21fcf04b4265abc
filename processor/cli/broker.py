"""`runstate broker`: a local single-node Kafka broker from Maven Central jars."""

import json
from pathlib import Path

import click

from processor.broker.launcher import (
    KAFKA_VERSION,
    Broker,
    BrokerError,
    cache_root,
    ensure_jars,
    start_broker,
)
from processor.cli.options import option

dir_option = option(
    "--dir",
    "data_dir",
    env="BROKER_DIR",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The broker's data directory (default: <cache>/broker). Starting an existing "
    "one restarts that broker with its data.",
)


def _default_dir(data_dir: Path | None) -> Path:
    return data_dir or cache_root() / "broker"


@click.group()
def broker() -> None:
    """A local Apache Kafka broker (KRaft, pinned version), from Maven Central jars.

    Needs Java 17+ and Maven; the jars are fetched once into the user cache
    (RUNSTATE_CACHE_DIR, default ~/.cache/runstate). No Docker needed.
    """


@broker.command()
@dir_option
@option("--port", env="BROKER_PORT", type=int, default=0, help="Client port (0: a free one).")
def start(data_dir: Path | None, port: int) -> None:
    """Start a broker in the background and print its address."""
    data_dir = _default_dir(data_dir)
    try:
        running = start_broker(data_dir, port=port, detach=True)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Kafka {KAFKA_VERSION} running at {running.bootstrap} (pid {running.pid})")
    click.echo(f"data: {running.data_dir}  log: {running.log_path}")
    click.echo(f"export RUNSTATE_BOOTSTRAP_SERVERS={running.bootstrap}")


@broker.command()
@dir_option
def stop(data_dir: Path | None) -> None:
    """Stop the broker started from --dir (SIGTERM, then SIGKILL after 30 s)."""
    data_dir = _default_dir(data_dir)
    found = Broker.load(data_dir)
    if found is None or not found.alive():
        click.echo(f"no broker running from {data_dir}")
        return
    try:
        found.stop()
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"stopped broker {found.bootstrap} (pid {found.pid})")


@broker.command()
@dir_option
@option("--json", "as_json", env="BROKER_STATUS_JSON", is_flag=True, help="Print JSON.")
def status(data_dir: Path | None, as_json: bool) -> None:
    """Say whether the broker from --dir runs, and where. Exit 1 when it does not."""
    data_dir = _default_dir(data_dir)
    found = Broker.load(data_dir)
    alive = found is not None and found.alive()
    if as_json:
        click.echo(json.dumps({"running": alive, **(found.__dict__ if found else {})}))
    elif found is None:
        click.echo(f"no broker was started from {data_dir}")
    else:
        state = "running" if alive else "stopped"
        click.echo(f"{state}: {found.bootstrap} (pid {found.pid}), data {found.data_dir}")
    raise SystemExit(0 if alive else 1)


@broker.command()
def fetch() -> None:
    """Fetch (or confirm the cache of) the broker jars without starting anything."""
    try:
        libs = ensure_jars()
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Kafka {KAFKA_VERSION} jars: {libs}")
