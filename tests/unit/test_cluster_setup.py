"""The local cluster without starting it: node configurations, the quorum's initial
voters, saved state, the coordinators' partition function and `broker start --brokers`."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from processor.broker.cluster import Cluster
from processor.broker.coordinators import coordinator_partition, java_string_hash, kafka_abs
from processor.broker.nodes import ClusterNode, internal_replication, node_configs
from processor.broker.quorum import initial_controllers
from processor.broker.server import ServerConfig

# (key, String.hashCode(), Utils.abs(h) % 3, Utils.abs(h) % 50), printed by Kafka 4.1.1's
# own org.apache.kafka.common.utils.Utils under Java 17. The negative ones tell
# Utils.abs apart from `h & 0x7fffffff`, which would give 2, 2 and 0 (of 3) for them.
JAVA = [
    ("", 0, 0, 0),
    ("a", 97, 1, 47),
    ("hello", 99162322, 1, 22),
    ("Aa", 2112, 0, 12),
    ("BB", 2112, 0, 12),
    ("polygenelubricants", -2147483648, 0, 0),  # Integer.MIN_VALUE: Utils.abs gives 0
    ("\U0001f600", 1772899, 1, 49),  # one code point, two UTF-16 units
    ("é", 233, 2, 33),
    ("tx-1", 3572520, 0, 20),
    ("runstate-worker-0", -22761816, 0, 16),
    ("runstate.g", -1113043617, 0, 17),
    ("zz-negative-7", -1700647604, 2, 4),
]


@pytest.mark.parametrize(("key", "hash_code", "of_3", "of_50"), JAVA)
def test_coordinator_partition_is_kafkas(key: str, hash_code: int, of_3: int, of_50: int) -> None:
    assert java_string_hash(key) == hash_code
    assert coordinator_partition(key, 3) == of_3
    assert coordinator_partition(key, 50) == of_50


def test_kafka_abs_is_not_a_mask() -> None:
    assert kafka_abs(-(2**31)) == 0
    assert kafka_abs(-5) == 5 != (-5 & 0x7FFFFFFF)
    assert kafka_abs(7) == 7


def test_replication_follows_the_cluster_size() -> None:
    # min(3, N) replicas; min.insync.replicas as `topics create` sets it (1 at two, so
    # one node down does not stop every producer).
    assert [internal_replication(n) for n in (1, 2, 3, 5)] == [(1, 1), (2, 1), (3, 2), (3, 2)]


def test_three_node_configs(tmp_path: Path) -> None:
    ports = [(9101, 9201), (9102, 9202), (9103, 9203)]
    configs = node_configs(ports, tmp_path, internal_partitions=3)
    controllers = "127.0.0.1:9201,127.0.0.1:9202,127.0.0.1:9203"
    rendered = [_properties(c.render()) for c in configs]
    for i, props in enumerate(rendered, start=1):
        assert props["node.id"] == str(i)
        assert props["process.roles"] == "broker,controller"
        assert props["controller.quorum.bootstrap.servers"] == controllers
        assert props["listeners"] == (f"PLAINTEXT://127.0.0.1:910{i},CONTROLLER://127.0.0.1:920{i}")
        assert props["log.dirs"] == str(tmp_path / f"node-{i}" / "kraft-logs")
        for key in (
            "default.replication.factor",
            "offsets.topic.replication.factor",
            "transaction.state.log.replication.factor",
            "share.coordinator.state.topic.replication.factor",
        ):
            assert props[key] == "3", key
        for key in (
            "min.insync.replicas",
            "transaction.state.log.min.isr",
            "share.coordinator.state.topic.min.isr",
        ):
            assert props[key] == "2", key
        assert props["offsets.topic.num.partitions"] == "3"
        assert props["transaction.state.log.num.partitions"] == "3"
    assert "controller.quorum.voters" not in rendered[0]  # a dynamic quorum (KIP-853)
    voters = initial_controllers(configs, ["dA", "dB", "dC"])
    assert voters == "1@127.0.0.1:9201:dA,2@127.0.0.1:9202:dB,3@127.0.0.1:9203:dC"


def test_the_single_broker_renders_as_before(tmp_path: Path) -> None:
    props = _properties(ServerConfig(1, 9092, 9093, "127.0.0.1:9093", tmp_path).render())
    assert props["node.id"] == "1"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:9093"
    for key in (
        "default.replication.factor",
        "min.insync.replicas",
        "offsets.topic.replication.factor",
        "offsets.topic.num.partitions",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "transaction.state.log.num.partitions",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "1", key
    assert props["auto.create.topics.enable"] == "false"
    assert props["group.min.session.timeout.ms"] == "1000"


def test_cluster_state_round_trips_and_answers_lookups(tmp_path: Path) -> None:
    cluster = Cluster(
        data_dir=str(tmp_path),
        cluster_id="c",
        internal_partitions=3,
        nodes=[
            ClusterNode(i, 9100 + i, 9200 + i, f"d{i}", 0, str(tmp_path / f"node-{i}"))
            for i in (1, 2, 3)
        ],
    )
    cluster.save()
    loaded = Cluster.load(tmp_path)
    assert loaded == cluster
    assert loaded.bootstrap == "127.0.0.1:9101,127.0.0.1:9102,127.0.0.1:9103"
    assert loaded.node_of_port(9102) == 2 and loaded.node_of_port(9203) == 3
    assert loaded.pids() == {1: 0, 2: 0, 3: 0}
    assert not loaded.alive() and not loaded.alive(2)
    with pytest.raises(KeyError):
        loaded.node_of_port(1)
    with pytest.raises(KeyError):
        loaded.node(4)
    assert Cluster.load(tmp_path / "nothing") is None


def test_broker_start_with_brokers_starts_a_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from processor.cli import broker as cli_broker
    from processor.cli.main import cli

    started = []

    def fake_start_cluster(data_dir: Path, brokers: int, *, detach: bool) -> Cluster:
        started.append((data_dir, brokers, detach))
        nodes = [ClusterNode(i, 9100 + i, 9200 + i, "d", 4000 + i, str(data_dir)) for i in (1, 2)]
        return Cluster(str(data_dir), "c", 3, nodes, detach)

    monkeypatch.setattr(cli_broker, "start_cluster", fake_start_cluster)
    env = {"RUNSTATE_BROKER_DIR": str(tmp_path / "c"), "RUNSTATE_BROKERS": "2"}
    result = CliRunner().invoke(cli, ["broker", "start"], env=env)
    assert result.exit_code == 0, result.output
    assert started == [(tmp_path / "c", 2, True)]
    assert "export RUNSTATE_BOOTSTRAP_SERVERS=127.0.0.1:9101,127.0.0.1:9102" in result.output
    refused = CliRunner().invoke(cli, ["broker", "start", "--port", "9092"], env=env)
    assert refused.exit_code == 2 and "--port applies to a single broker" in refused.output


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")
    return {key: value for key, value in pairs}


def test_a_node_never_started_is_not_signalled() -> None:
    """pid 0 is what a node has before its first start; os.killpg(0) would signal the
    caller's own process group (this test run)."""
    from processor.broker.server import kill_process, pid_alive, signal_group

    assert not pid_alive(0)
    signal_group(0, 9)
    kill_process(0)


def test_a_pid_that_is_no_longer_the_servers_is_never_signalled() -> None:
    """A server leads its own process group. Once it is gone, its pid may belong to any
    process: one that leads no group of that id is not the server, is not alive for a
    stop, and gets no signal (a stop after a crash once sent SIGTERM to a test runner
    that had the pid since)."""
    import signal
    import subprocess
    import sys

    from processor.broker.server import pid_alive, signal_group, stop_process

    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    stranger = subprocess.Popen(sleep)  # in this test run's process group
    server = subprocess.Popen(sleep, start_new_session=True)
    try:
        assert not pid_alive(stranger.pid)
        signal_group(stranger.pid, signal.SIGTERM)
        stop_process(stranger.pid, timeout=1)
        assert stranger.poll() is None  # untouched
        assert pid_alive(server.pid)
        stop_process(server.pid, timeout=10)  # SIGTERM; returns once it is gone
        assert not pid_alive(server.pid)
    finally:
        for process in (stranger, server):
            process.kill()
            process.wait()
