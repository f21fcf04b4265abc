"""One Kafka server process (KRaft) of ours, whatever it belongs to: its configuration
rendered, its storage formatted, its JVM spawned in its own process group, awaited
until it serves clients, signalled and reaped. The single broker (`launcher.py`) and
every node of a cluster (`cluster.py`) are made of these."""

import base64
import functools
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from processor.broker.jars import KAFKA_VERSION, BrokerError, ensure_jars, find_java, resource
from processor.runtimes.children import die_with_parent

READY_LINE = "Kafka Server started"
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports (one asked after another may come back the same)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def accepts(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def new_uuid() -> str:
    """What `kafka-storage random-uuid` prints: a base64url UUID without padding, and
    (as Kafka's own Uuid.randomUuid ensures) not starting with '-', which the format
    command's parser took for an option: one broker start in 64 failed that way.
    Cluster ids and log directory ids are both of this form."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass(frozen=True)
class Jvm:
    """The java binary and the Kafka jars' classpath every server and tool runs with."""

    java: str
    classpath: str

    @classmethod
    def find(cls, console: Console | None = None) -> "Jvm":
        """Fetches the jars on first use; raises BrokerError naming what is missing."""
        libs = ensure_jars(console)
        return cls(find_java(), str(libs / "*"))


@dataclass(frozen=True)
class ServerConfig:
    """What differs between the servers we start: one combined broker+controller node
    on loopback. `replication` and `min_isr` apply to the internal topics and to topics
    created without their own settings."""

    node_id: int
    port: int
    controller_port: int
    controller_bootstrap: str  # host:port of every controller, comma-separated
    log_dir: Path
    internal_partitions: int = 1
    replication: int = 1
    min_isr: int = 1

    def render(self) -> str:
        """server.properties, from resources/server.properties.template."""
        return (
            resource("server.properties.template")
            .read_text()
            .format(
                node_id=self.node_id,
                port=self.port,
                controller_port=self.controller_port,
                controller_bootstrap=self.controller_bootstrap,
                log_dir=self.log_dir,
                internal_partitions=self.internal_partitions,
                replication=self.replication,
                min_isr=self.min_isr,
            )
        )


def run_tool(
    jvm: Jvm, main: str, *args: str, tools: Path | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """One of Kafka's command-line tools (class `main`), run to its end; `tools` adds
    the tools jar's directory (ensure_tools) to the broker jars' classpath."""
    classpath = f"{jvm.classpath}:{tools / '*'}" if tools else jvm.classpath
    return subprocess.run(
        [
            jvm.java,
            f"-Dlog4j2.configurationFile={resource('log4j2-tools.properties')}",
            "-cp",
            classpath,
            main,
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def format_storage(jvm: Jvm, config: Path, cluster_id: str, *how: str) -> None:
    """`kafka-storage format` of the log directory `config` names. `how` is the quorum's
    part: --standalone, --initial-controllers ..., or --no-initial-controllers."""
    fmt = run_tool(
        jvm, "kafka.tools.StorageTool", "format", *how, "-t", cluster_id, "-c", str(config)
    )
    if fmt.returncode != 0:
        raise BrokerError(
            f"formatting KRaft storage for {config} failed:\n{fmt.stdout}{fmt.stderr}\n"
            "Use an empty directory (--dir) or delete this one."
        )


def spawn(
    jvm: Jvm,
    config: Path,
    log_path: Path,
    *,
    heap: tuple[str, str],
    detach: bool,
    death_signal: int = signal.SIGTERM,
) -> subprocess.Popen[bytes]:
    """The server's JVM, its output appended to `log_path`, leading its own process
    group (so a signal reaches everything it started). Unless `detach`, it gets
    `death_signal` when this process dies, however it dies."""
    initial, maximum = heap
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [
                jvm.java,
                f"-Xms{initial}",
                f"-Xmx{maximum}",
                "-XX:+UseG1GC",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={resource('log4j2-server.properties')}",
                "-cp",
                jvm.classpath,
                "kafka.Kafka",
                str(config),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=None if detach else functools.partial(die_with_parent, death_signal),
        )


def wait_started(
    process: subprocess.Popen[bytes],
    port: int,
    log_path: Path,
    offset: int,
    timeout: float,
    console: Console,
    on_timeout: Callable[[], None],
) -> None:
    """Until the server logs that it started (after `offset` in its log) and accepts
    connections on `port`; `on_timeout` (a stop) runs before the error is raised."""
    deadline = time.monotonic() + timeout
    address = f"{LOOPBACK}:{port}"
    with console.status(f"Starting Kafka {KAFKA_VERSION} at {address}"):
        while True:
            if process.poll() is not None:
                raise BrokerError(
                    f"the broker at {address} exited with code {process.returncode} while "
                    f"starting; its log ({log_path}) ends with:\n{tail(log_path)}"
                )
            if accepts(port) and READY_LINE in read_from(log_path, offset):
                return
            if time.monotonic() > deadline:
                on_timeout()
                raise BrokerError(
                    f"the broker at {address} did not start within {timeout:.0f}s; its log "
                    f"({log_path}) ends with:\n{tail(log_path)}"
                )
            time.sleep(0.2)


def pid_alive(pid: int) -> bool:
    """Whether the server started as `pid` still runs. A server leads its own process
    group (`spawn`), so it is asked of the group: once the server is gone the system
    may give its pid to any other process, which must never count as the server (nor
    be signalled as it: see `signal_group`)."""
    if pid <= 0:  # never started (0 would name our own process group)
        return False
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours is dead for every purpose here.
    try:
        status = Path(f"/proc/{pid}/stat").read_text().split()[2]
        return status != "Z"
    except OSError:
        return True


def signal_group(pid: int, sig: int) -> None:
    """`sig` to the process group the server started as `pid` leads, if it still exists.
    Never to the bare pid: with the group gone, that pid may be another process's (a
    stop after the server had died sent SIGTERM to whatever had the pid since)."""
    if pid <= 0:  # never started: killpg(0) would signal our own process group
        return
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # the server leads its own process group


def reap(pid: int) -> None:
    with suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop_process(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM (Kafka shuts down cleanly), then SIGKILL after `timeout`; never leaves it."""
    if not pid_alive(pid):
        return
    signal_group(pid, signal.SIGTERM)
    # A paused (SIGSTOPped) server would hold the SIGTERM pending and never exit.
    signal_group(pid, signal.SIGCONT)
    if _gone_within(pid, timeout):
        return
    kill_process(pid)
    if pid_alive(pid):
        raise BrokerError(f"broker process {pid} did not exit; kill it by hand")


def kill_process(pid: int) -> None:
    """SIGKILL, as a crash would; returns once it is gone (or after 5 s)."""
    signal_group(pid, signal.SIGKILL)
    _gone_within(pid, 5.0)


def _gone_within(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        reap(pid)
        if not pid_alive(pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
