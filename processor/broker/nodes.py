"""A cluster's nodes: each node's server configuration (its id, ports and directory)
and what is saved of it.

Replication of the internal topics, and of topics created without their own, follows
the cluster's size as `runstate topics create` does: min(3, N) replicas,
`min.insync.replicas` from processor.kafka.topic_plans.
"""

from dataclasses import dataclass
from pathlib import Path

from processor.broker.server import LOOPBACK, ServerConfig, pid_alive
from processor.kafka.topic_plans import default_replication, min_insync_replicas


def internal_replication(brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) of the internal topics and of topics
    created without their own: the rule `runstate topics create` applies."""
    replication = default_replication(brokers)
    return replication, min_insync_replicas(replication) or 1


def node_configs(
    ports: list[tuple[int, int]], data_dir: Path, internal_partitions: int
) -> list[ServerConfig]:
    """One ServerConfig per node (ids 1..N) from its (client port, controller port)."""
    replication, min_isr = internal_replication(len(ports))
    controllers = ",".join(f"{LOOPBACK}:{controller}" for _, controller in ports)
    return [
        ServerConfig(
            node_id=i,
            port=port,
            controller_port=controller,
            controller_bootstrap=controllers,
            log_dir=data_dir / f"node-{i}" / "kraft-logs",
            internal_partitions=internal_partitions,
            replication=replication,
            min_isr=min_isr,
        )
        for i, (port, controller) in enumerate(ports, start=1)
    ]


@dataclass
class ClusterNode:
    """One node: its id, ports, directory and (while it runs) its JVM's pid."""

    node_id: int
    port: int
    controller_port: int
    #: Its metadata log directory's id, half of its voter key (id, directory id).
    directory_id: str
    pid: int
    dir: str

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def config_path(self) -> Path:
        return Path(self.dir) / "server.properties"

    @property
    def log_dir(self) -> Path:
        return Path(self.dir) / "kraft-logs"

    @property
    def log_path(self) -> Path:
        return Path(self.dir) / "broker.log"

    def alive(self) -> bool:
        return self.pid > 0 and pid_alive(self.pid)
