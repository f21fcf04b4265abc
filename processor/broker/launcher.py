"""A real single-node Apache Kafka broker (KRaft) from Maven Central jars, no Docker.

Each broker gets a data directory, free loopback ports and its own log. Tests, the demo
and `runstate broker` all start single brokers through `start_broker`; a cluster of
several nodes is `cluster.py`'s, made of the same server processes (`server.py`).
"""

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console

# Re-exported: the launcher is where callers have always found these.
from processor.broker.jars import (
    KAFKA_VERSION,
    BrokerError,
    cache_root,
    ensure_jars,
    find_java,
    find_maven,
    jars_dir,
)
from processor.broker.server import (
    LOOPBACK,
    Jvm,
    ServerConfig,
    format_storage,
    free_port,
    kill_process,
    new_uuid,
    pid_alive,
    spawn,
    stop_process,
    wait_started,
)

__all__ = [
    "KAFKA_VERSION",
    "STATE_FILE",
    "Broker",
    "BrokerError",
    "cache_root",
    "ensure_jars",
    "find_java",
    "find_maven",
    "free_port",
    "jars_dir",
    "new_data_dir",
    "running_broker",
    "start_broker",
]

STATE_FILE = "broker.json"
#: The single broker's JVM heap (initial, maximum).
HEAP = ("256m", "1g")


def new_data_dir(prefix: str = "broker-") -> Path:
    """A fresh directory under <cache>/brokers for a broker or cluster made here."""
    parent = cache_root() / "brokers"
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


@dataclass
class Broker:
    """A running (or stopped) local broker; `bootstrap` is what clients connect to."""

    bootstrap: str
    pid: int
    data_dir: str
    log_path: str
    port: int
    controller_port: int

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (Kafka shuts down cleanly), then SIGKILL after `timeout`; never leaves it."""
        stop_process(self.pid, timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        kill_process(self.pid)

    def save(self) -> None:
        (Path(self.data_dir) / STATE_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, data_dir: Path) -> "Broker | None":
        try:
            return cls(**json.loads((data_dir / STATE_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None


def start_broker(
    data_dir: Path | None = None,
    *,
    port: int = 0,
    controller_port: int = 0,
    internal_partitions: int = 1,
    timeout: float = 120.0,
    console: Console | None = None,
    detach: bool = False,
) -> Broker:
    """Start a broker and wait until it accepts clients.

    A new `data_dir` is formatted; an existing one (formatted by an earlier start) is
    restarted with its data and ports, as after a broker restart. Unless `detach`, the
    broker is stopped when this process dies, however it dies.
    """
    console = console or Console(stderr=True)
    jvm = Jvm.find(console)
    data_dir = data_dir or new_data_dir()
    data_dir.mkdir(parents=True, exist_ok=True)
    previous = Broker.load(data_dir)
    if previous is not None and previous.alive():
        raise BrokerError(
            f"a broker already runs from {data_dir} at {previous.bootstrap} (pid "
            f"{previous.pid}); stop it first: runstate broker stop --dir {data_dir}"
        )
    log_dir = data_dir / "kraft-logs"
    config = data_dir / "server.properties"
    if not (log_dir / "meta.properties").exists():
        if previous is None:
            port = port or free_port()
            controller_port = controller_port or free_port()
        else:  # formatting failed last time; keep the address clients were told
            port, controller_port = previous.port, previous.controller_port
        server = ServerConfig(
            node_id=1,
            port=port,
            controller_port=controller_port,
            controller_bootstrap=f"{LOOPBACK}:{controller_port}",
            log_dir=log_dir,
            internal_partitions=internal_partitions,
        )
        config.write_text(server.render())
        format_storage(jvm, config, new_uuid(), "--standalone")
    else:
        if previous is None:
            raise BrokerError(f"{data_dir} holds KRaft data but no {STATE_FILE}; use a new --dir")
        port, controller_port = previous.port, previous.controller_port

    log_path = data_dir / "broker.log"
    process = spawn(jvm, config, log_path, heap=HEAP, detach=detach)
    broker = Broker(
        bootstrap=f"{LOOPBACK}:{port}",
        pid=process.pid,
        data_dir=str(data_dir),
        log_path=str(log_path),
        port=port,
        controller_port=controller_port,
    )
    broker.save()
    offset = log_path.stat().st_size
    wait_started(process, port, log_path, offset, timeout, console, broker.stop)
    return broker


@contextmanager
def running_broker(
    data_dir: Path | None = None, *, console: Console | None = None
) -> Iterator[Broker]:
    """A broker for the length of a `with` block; stopped, reaped and, when the data
    directory was made here, deleted on exit."""
    own_dir = data_dir is None
    data_dir = data_dir or new_data_dir()
    try:
        broker = start_broker(data_dir, console=console)
        try:
            yield broker
        finally:
            broker.stop()
    finally:
        if own_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
