"""A local Apache Kafka cluster (KRaft) of N combined broker+controller nodes on
loopback, for the fault scenarios that one broker cannot show: a partition's leader or
a coordinator killed, a node paused past its session, a rolling restart, a node whose
disk is lost.

The nodes share a cluster id and bootstrap a dynamic controller quorum (KIP-853:
`controller.quorum.bootstrap.servers` and `kafka-storage format --initial-controllers`,
every node a voter). Each has its own directory (`node-<id>/`: server.properties,
kraft-logs/, broker.log), ports and JVM.
"""

import json
import shutil
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from rich.console import Console

from processor.broker import coordinators
from processor.broker.jars import BrokerError, ensure_tools
from processor.broker.launcher import new_data_dir
from processor.broker.nodes import ClusterNode, node_configs
from processor.broker.quorum import Quorum, initial_controllers
from processor.broker.server import (
    Jvm,
    format_storage,
    free_ports,
    kill_process,
    new_uuid,
    signal_group,
    spawn,
    stop_process,
    wait_started,
)

CLUSTER_FILE = "cluster.json"
#: Each node's JVM heap (initial, maximum): three of them share a laptop or a CI runner.
NODE_HEAP = ("128m", "512m")
#: Partitions of __consumer_offsets and __transaction_state: more than one, so the
#: coordinators of different groups and transactional ids land on different nodes.
INTERNAL_PARTITIONS = 3


@dataclass
class Cluster:
    """A local cluster, running or not; saved in `data_dir`/cluster.json after every
    change, so another process (`runstate broker stop`) can load and drive it.

    Nodes are named by their node id (1..N). Unless `detach`, a node dies with the
    thread that started it (SIGKILL, not SIGTERM: a paused node would hold a SIGTERM
    pending for ever), so start and restart nodes from a thread that outlives them.
    """

    data_dir: str
    cluster_id: str
    internal_partitions: int
    nodes: list[ClusterNode]
    detach: bool = False

    # -- where things are ------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every node's client address, comma-separated: what clients connect to."""
        return ",".join(node.address for node in self.nodes)

    @property
    def node_ids(self) -> list[int]:
        return [node.node_id for node in self.nodes]

    def node(self, node_id: int) -> ClusterNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in the cluster at {self.data_dir}: {self.node_ids}")

    def node_of_port(self, port: int) -> int:
        """The node id listening on `port` (its client or its controller port)."""
        for node in self.nodes:
            if port in (node.port, node.controller_port):
                return node.node_id
        raise KeyError(f"no node of the cluster at {self.data_dir} listens on {port}")

    def pids(self) -> dict[int, int]:
        """node id -> pid of its JVM (the last one started; see alive)."""
        return {node.node_id: node.pid for node in self.nodes}

    def alive(self, node_id: int | None = None) -> bool:
        """Whether that node's JVM runs; without a node, whether every node's does."""
        nodes = self.nodes if node_id is None else [self.node(node_id)]
        return all(node.alive() for node in nodes)

    # -- faults, one node at a time -----------------------------------------------------

    def kill(self, node_id: int) -> None:
        """SIGKILL, as a crash would."""
        kill_process(self.node(node_id).pid)

    def stop(self, node_id: int, timeout: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown: its leaderships move first), SIGKILL after
        `timeout`."""
        stop_process(self.node(node_id).pid, timeout)

    def pause(self, node_id: int) -> None:
        """SIGSTOP: the node freezes (a GC pause, a frozen VM) with its sockets open."""
        signal_group(self.node(node_id).pid, signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        """SIGCONT after pause."""
        signal_group(self.node(node_id).pid, signal.SIGCONT)

    def start(self, node_id: int, timeout: float = 120.0, console: Console | None = None) -> None:
        """Start a stopped or killed node again with its data and ports, and wait until
        it serves clients."""
        node = self.node(node_id)
        if node.alive():
            raise BrokerError(f"node {node_id} already runs (pid {node.pid})")
        self._start_nodes([node], timeout, console or Console(stderr=True))

    def wipe_and_start(
        self, node_id: int, timeout: float = 120.0, console: Console | None = None
    ) -> None:
        """A node whose data directory is lost: killed if it runs, its log directory
        (data and metadata log) deleted, formatted again with the cluster's id and its
        node id, started; then back in the controller quorum and in the ISR of every
        partition it holds before this returns.

        What KRaft 4.1 requires of a controller that lost its metadata log: it must not
        come back as the voter it was. A voter's vote and log are promises the quorum
        counts on; an empty one formatted with its old directory id (which does start,
        and does rejoin) could vote in a leader that lacks committed metadata (KIP-853's
        motivation). So it is formatted `--no-initial-controllers`, which gives its log
        directory a new directory id; it starts as an observer and fetches the metadata
        log from the leader; then its old voter key (id, old directory id) is removed
        from the quorum and the new one added (kafka-metadata-quorum remove-controller,
        add-controller), as Kafka's operations guide describes for a lost controller.
        The broker half needs nothing more: it registers with its new directory and no
        clean shutdown behind it, so the controller takes it out of every ISR (if
        fencing it had not already), and it rejoins each one as its replica catches up.
        """
        console = console or Console(stderr=True)
        node = self.node(node_id)
        deadline = time.monotonic() + timeout
        old_voter = (node_id, node.directory_id)
        if node.alive():
            kill_process(node.pid)
        shutil.rmtree(node.log_dir, ignore_errors=True)
        jvm = Jvm.find(console)
        quorum = Quorum(jvm, ensure_tools(console), self.bootstrap)
        with ThreadPoolExecutor(1) as pool:
            # The lost voter leaves the quorum while its node formats and starts (each
            # tool run is a JVM start too); the node is spawned from this thread.
            removed = pool.submit(quorum.discard, *old_voter)
            format_storage(jvm, node.config_path, self.cluster_id, "--no-initial-controllers")
            node.directory_id = _directory_id(node.log_dir)
            self.save()
            self._start_nodes([node], max(1.0, deadline - time.monotonic()), console)
            removed.result()
        quorum.add(node.config_path, deadline)
        self.wait_in_sync(node_id, timeout=max(1.0, deadline - time.monotonic()))

    # -- the whole cluster ------------------------------------------------------------

    def stop_all(self, timeout: float = 30.0) -> None:
        """Every node at once: SIGTERM, SIGKILL to what remains after `timeout`."""
        running = [node for node in self.nodes if node.alive()]
        for node in running:  # all together: one at a time, the last waits on a quorum
            signal_group(node.pid, signal.SIGTERM)
            signal_group(node.pid, signal.SIGCONT)
        deadline = time.monotonic() + timeout
        for node in running:
            stop_process(node.pid, max(0.0, deadline - time.monotonic()))

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every running node is a registered, unfenced broker of the cluster."""
        deadline = time.monotonic() + timeout
        while True:
            running = {node.node_id for node in self.nodes if node.alive()}
            try:
                described = self.admin.describe_cluster(request_timeout=5).result()
                serving = {node.id for node in described.nodes}
            except KafkaException:
                serving = set()
            if running <= serving:
                return
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"nodes {sorted(running - serving)} of the cluster at {self.data_dir} "
                    f"did not join within {timeout:.0f}s; their logs: "
                    + ", ".join(str(self.node(i).log_path) for i in sorted(running - serving))
                )
            time.sleep(0.2)

    def wait_in_sync(self, node_id: int | None = None, timeout: float = 120.0) -> None:
        """Until `node_id` (every replica, without one) is in the ISR of every partition
        of every topic it holds, the internal ones included."""
        deadline = time.monotonic() + timeout
        while True:
            lagging = self.out_of_sync(node_id)
            if not lagging:
                return
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"not in sync after {timeout:.0f}s: {', '.join(lagging[:10])}"
                    + (f" and {len(lagging) - 10} more" if len(lagging) > 10 else "")
                )
            time.sleep(0.2)

    def out_of_sync(self, node_id: int | None = None) -> list[str]:
        """`topic[partition]: node n` for every replica (of `node_id` only, when given)
        missing from its partition's ISR in the metadata a broker answers with."""
        try:
            topics = self.admin.list_topics(timeout=5).topics
        except KafkaException as exc:
            return [f"no metadata ({exc})"]
        lagging = []
        for name, topic in sorted(topics.items()):
            for index, partition in sorted(topic.partitions.items()):
                for replica in partition.replicas:
                    if node_id in (None, replica) and replica not in partition.isrs:
                        lagging.append(f"{name}[{index}]: node {replica}")
        return lagging

    # -- lookups for the faults ---------------------------------------------------------

    @cached_property
    def admin(self) -> AdminClient:
        # log_level 0: connections to a killed or paused node fail by design here.
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def leader_of(self, topic: str, partition: int) -> int:
        return coordinators.leader_of(self.admin, topic, partition)

    def group_coordinator(self, group_id: str) -> int:
        return coordinators.group_coordinator(self.admin, group_id)

    def transaction_coordinator(self, transactional_id: str) -> int:
        return coordinators.transaction_coordinator(self.admin, transactional_id)

    # -- state ------------------------------------------------------------------------

    def save(self) -> None:
        (Path(self.data_dir) / CLUSTER_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, data_dir: Path) -> "Cluster | None":
        try:
            state = json.loads((data_dir / CLUSTER_FILE).read_text())
            nodes = [ClusterNode(**node) for node in state.pop("nodes")]
            return cls(nodes=nodes, **state)
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _start_nodes(self, nodes: list[ClusterNode], timeout: float, console: Console) -> None:
        """Spawn the nodes together (a quorum forms only once most of them run), then
        wait for each to serve and for all to have joined."""
        jvm = Jvm.find(console)
        started = []
        for node in nodes:
            offset = node.log_path.stat().st_size if node.log_path.exists() else 0
            process = spawn(
                jvm,
                node.config_path,
                node.log_path,
                heap=NODE_HEAP,
                detach=self.detach,
                death_signal=signal.SIGKILL,
            )
            node.pid = process.pid
            started.append((node, process, offset))
        self.save()
        deadline = time.monotonic() + timeout
        for node, process, offset in started:
            wait_started(
                process,
                node.port,
                node.log_path,
                offset,
                max(1.0, deadline - time.monotonic()),
                console,
                lambda: self.stop_all(10.0),
            )
        self.wait_ready(max(1.0, deadline - time.monotonic()))


def _directory_id(log_dir: Path) -> str:
    for line in (log_dir / "meta.properties").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "directory.id":
            return value.strip()
    raise BrokerError(f"{log_dir}/meta.properties has no directory.id")


def start_cluster(
    data_dir: Path | None = None,
    brokers: int = 3,
    *,
    internal_partitions: int = INTERNAL_PARTITIONS,
    timeout: float = 180.0,
    console: Console | None = None,
    detach: bool = False,
) -> Cluster:
    """Start a cluster of `brokers` nodes and wait until every one serves clients.

    A new `data_dir` is formatted; one holding a cluster (from an earlier start) is
    restarted with its data and ports. Unless `detach`, every node is stopped when
    this process dies, however it dies.
    """
    if brokers < 1:
        raise BrokerError(f"a cluster needs at least one node, not {brokers}")
    console = console or Console(stderr=True)
    jvm = Jvm.find(console)
    data_dir = data_dir or new_data_dir("cluster-")
    data_dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster.load(data_dir)
    if cluster is not None:
        running = [node.node_id for node in cluster.nodes if node.alive()]
        if running:
            raise BrokerError(
                f"nodes {running} of the cluster in {data_dir} already run; stop it first: "
                f"runstate broker stop --dir {data_dir}"
            )
        if len(cluster.nodes) != brokers:
            raise BrokerError(
                f"{data_dir} holds a cluster of {len(cluster.nodes)} nodes, not {brokers}; "
                "use a new --dir"
            )
        cluster.detach = detach
    else:
        if any(data_dir.iterdir()):
            raise BrokerError(
                f"{data_dir} is not empty and holds no {CLUSTER_FILE}; use a new --dir"
            )
        free = free_ports(2 * brokers)
        ports = list(zip(free[::2], free[1::2], strict=True))
        configs = node_configs(ports, data_dir, internal_partitions)
        directory_ids = [new_uuid() for _ in configs]
        cluster = Cluster(
            data_dir=str(data_dir),
            cluster_id=new_uuid(),
            internal_partitions=internal_partitions,
            nodes=[
                ClusterNode(c.node_id, c.port, c.controller_port, d, 0, str(c.log_dir.parent))
                for c, d in zip(configs, directory_ids, strict=True)
            ],
            detach=detach,
        )
        voters = initial_controllers(configs, directory_ids)
        for config, node in zip(configs, cluster.nodes, strict=True):
            Path(node.dir).mkdir()
            node.config_path.write_text(config.render())
        with ThreadPoolExecutor(len(configs)) as pool:  # each format is a JVM start
            formats = [
                pool.submit(
                    format_storage,
                    jvm,
                    node.config_path,
                    cluster.cluster_id,
                    "--initial-controllers",
                    voters,
                )
                for node in cluster.nodes
            ]
            for done in formats:
                done.result()
    cluster.save()
    try:
        cluster._start_nodes(cluster.nodes, timeout, console)
    except BaseException:
        cluster.stop_all(10.0)  # no half-started cluster left behind, detached or not
        raise
    return cluster


@contextmanager
def running_cluster(
    data_dir: Path | None = None,
    brokers: int = 3,
    *,
    console: Console | None = None,
    stop_timeout: float = 30.0,
) -> Iterator[Cluster]:
    """A cluster for the length of a `with` block; stopped (SIGKILL after
    `stop_timeout`; 0 kills at once) and, when the data directory was made here,
    deleted on exit."""
    own_dir = data_dir is None
    data_dir = data_dir or new_data_dir("cluster-")
    try:
        cluster = start_cluster(data_dir, brokers, console=console)
        try:
            yield cluster
        finally:
            cluster.stop_all(stop_timeout)
    finally:
        if own_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
