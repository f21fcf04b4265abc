"""`runstate broker`: a local Kafka broker, or a cluster of them, from Maven Central jars."""

import json
from pathlib import Path
from typing import Any

import click

from processor.broker.cluster import Cluster, start_cluster
from processor.broker.jars import ensure_tools
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
    help="The broker's (or cluster's) data directory (default: <cache>/broker). Starting "
    "an existing one restarts what it holds with its data and ports.",
)


def _default_dir(data_dir: Path | None) -> Path:
    return data_dir or cache_root() / "broker"


@click.group()
def broker() -> None:
    """A local Apache Kafka broker, or a cluster of them (KRaft, pinned version), from
    Maven Central jars.

    Needs Java 17+ and Maven; the jars are fetched once into the user cache
    (RUNSTATE_CACHE_DIR, default ~/.cache/runstate). No Docker needed.
    """


@broker.command()
@dir_option
@option(
    "--port",
    env="BROKER_PORT",
    type=int,
    default=0,
    help="Client port of a single broker (0: a free one; a cluster's are free ones).",
)
@option(
    "--brokers",
    env="BROKERS",
    type=click.IntRange(min=1),
    default=None,
    help="Nodes to start: 1 (the default) a single broker; 2 or more a cluster of "
    "combined broker+controller nodes on loopback, each with its own ports, data and "
    "log under --dir/node-<id>. The internal topics, and topics created without "
    "settings of their own, get min(3, nodes) replicas and min.insync.replicas as "
    "`runstate topics create` gives them. Restarting a --dir restarts what it holds.",
)
def start(data_dir: Path | None, port: int, brokers: int | None) -> None:
    """Start a broker (or a cluster) in the background and print its address."""
    data_dir = _default_dir(data_dir)
    existing = Cluster.load(data_dir)
    nodes = brokers or (len(existing.nodes) if existing else 1)
    if nodes > 1 and port:
        raise click.UsageError("--port applies to a single broker; a cluster's ports are free ones")
    try:
        if existing is None and nodes == 1:
            _started_broker(start_broker(data_dir, port=port, detach=True))
            return
        if Broker.load(data_dir) is not None:
            raise BrokerError(f"{data_dir} holds a single broker; use a new --dir for a cluster")
        _started_cluster(start_cluster(data_dir, nodes, detach=True))
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc


def _started_broker(running: Broker) -> None:
    click.echo(f"Kafka {KAFKA_VERSION} running at {running.bootstrap} (pid {running.pid})")
    click.echo(f"data: {running.data_dir}  log: {running.log_path}")
    click.echo(f"export RUNSTATE_BOOTSTRAP_SERVERS={running.bootstrap}")


def _started_cluster(cluster: Cluster) -> None:
    click.echo(
        f"Kafka {KAFKA_VERSION} cluster of {len(cluster.nodes)} nodes running, "
        f"data {cluster.data_dir}"
    )
    for node in cluster.nodes:
        click.echo(f"node {node.node_id}: {node.address} (pid {node.pid})  log: {node.log_path}")
    click.echo(f"export RUNSTATE_BOOTSTRAP_SERVERS={cluster.bootstrap}")


@broker.command()
@dir_option
def stop(data_dir: Path | None) -> None:
    """Stop the broker (or every node of the cluster) started from --dir (SIGTERM, then
    SIGKILL after 30 s)."""
    data_dir = _default_dir(data_dir)
    cluster = Cluster.load(data_dir)
    try:
        if cluster is not None:
            running = [node.node_id for node in cluster.nodes if node.alive()]
            if not running:
                click.echo(f"no node of the cluster in {data_dir} is running")
                return
            cluster.stop_all()
            click.echo(f"stopped nodes {', '.join(map(str, running))} of {cluster.bootstrap}")
            return
        found = Broker.load(data_dir)
        if found is None or not found.alive():
            click.echo(f"no broker running from {data_dir}")
            return
        found.stop()
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"stopped broker {found.bootstrap} (pid {found.pid})")


@broker.command()
@dir_option
@option("--json", "as_json", env="BROKER_STATUS_JSON", is_flag=True, help="Print JSON.")
def status(data_dir: Path | None, as_json: bool) -> None:
    """Say whether the broker from --dir runs, and where; for a cluster, each node (with
    --json: `nodes`, each its id, port, controller_port, pid and alive). Exit 1 unless
    it runs (for a cluster: every node)."""
    data_dir = _default_dir(data_dir)
    cluster = Cluster.load(data_dir)
    if cluster is not None:
        raise SystemExit(_cluster_status(cluster, as_json))
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


def _cluster_status(cluster: Cluster, as_json: bool) -> int:
    nodes: list[dict[str, Any]] = [
        {
            "id": node.node_id,
            "port": node.port,
            "controller_port": node.controller_port,
            "pid": node.pid,
            "alive": node.alive(),
        }
        for node in cluster.nodes
    ]
    running = all(node["alive"] for node in nodes)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "running": running,
                    "bootstrap": cluster.bootstrap,
                    "data_dir": cluster.data_dir,
                    "cluster_id": cluster.cluster_id,
                    "nodes": nodes,
                }
            )
        )
    else:
        up = sum(node["alive"] for node in nodes)
        click.echo(f"cluster of {len(nodes)} nodes, {up} running, data {cluster.data_dir}")
        for node in nodes:
            state = "running" if node["alive"] else "stopped"
            click.echo(f"node {node['id']}: {state}: 127.0.0.1:{node['port']} (pid {node['pid']})")
    return 0 if running else 1


@broker.command()
def fetch() -> None:
    """Fetch (or confirm the cache of) the broker jars, and the tools jar a cluster uses
    to bring back a node whose data was lost, without starting anything."""
    try:
        libs = ensure_jars()
        tools = ensure_tools()
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Kafka {KAFKA_VERSION} jars: {libs}; tools: {tools}")
