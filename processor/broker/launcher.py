"""A real single-node Apache Kafka broker (KRaft) from Maven Central jars, no Docker.

The jars of one pinned version are fetched once with Maven into a user cache and
reused; each broker gets a data directory, free loopback ports and its own log.
Tests, the demo and `runstate broker` all start brokers through `start_broker`.
"""

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from rich.console import Console

from processor.children import die_with_parent

KAFKA_VERSION = "4.1.1"
JAVA_MIN_MAJOR = 17
READY_LINE = "Kafka Server started"
STATE_FILE = "broker.json"


class BrokerError(RuntimeError):
    """Starting or stopping a broker failed; the message says what to do next."""


def cache_root() -> Path:
    """RUNSTATE_CACHE_DIR, else $XDG_CACHE_HOME/runstate, else ~/.cache/runstate."""
    explicit = os.environ.get("RUNSTATE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runstate"


def jars_dir(version: str = KAFKA_VERSION) -> Path:
    return cache_root() / f"kafka-{version}" / "libs"


def _resource(name: str) -> Path:
    path = resources.files(__package__).joinpath("resources", name)
    return Path(str(path))


def find_java() -> str:
    """The java binary (JAVA_HOME first), checked to be version 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise BrokerError(
            "Java is not installed: the local Kafka broker needs Java 17 or newer. Install "
            "OpenJDK 17 (Debian/Ubuntu: apt install openjdk-17-jre-headless; macOS: brew "
            "install openjdk@17) or set JAVA_HOME; or point RUNSTATE_BOOTSTRAP_SERVERS at "
            "an existing broker."
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8.0" style
        major = int(match.group(2))
    if major < JAVA_MIN_MAJOR:
        raise BrokerError(
            f"{java} is Java {major or 'of unknown version'}; Kafka {KAFKA_VERSION} needs "
            f"Java {JAVA_MIN_MAJOR} or newer. Install OpenJDK 17 and set JAVA_HOME to it."
        )
    return java


def find_maven() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            "Maven (mvn) is not installed: it fetches the Kafka broker jars from Maven "
            "Central once. Install Maven 3.6+ (Debian/Ubuntu: apt install maven; macOS: "
            "brew install maven), or use Docker (docker compose up), or set "
            "RUNSTATE_BOOTSTRAP_SERVERS to an existing broker."
        )
    return mvn


def ensure_jars(console: Console | None = None) -> Path:
    """The cached broker jars, fetched with Maven on first use only."""
    libs = jars_dir()
    marker = libs / ".complete"
    if marker.exists():
        return libs
    mvn = find_maven()
    find_java()
    libs.parent.mkdir(parents=True, exist_ok=True)
    console = console or Console(stderr=True)
    with tempfile.TemporaryDirectory(dir=libs.parent, prefix="fetch-") as tmp:
        shutil.copy(_resource("pom.xml"), Path(tmp) / "pom.xml")
        staged = Path(tmp) / "libs"
        with console.status(
            f"Fetching Apache Kafka {KAFKA_VERSION} jars from Maven Central (once; cached in "
            f"{libs})"
        ):
            result = subprocess.run(
                [
                    mvn,
                    "-q",
                    "-B",
                    "dependency:copy-dependencies",
                    "-DincludeScope=runtime",
                    f"-DoutputDirectory={staged}",
                ],
                cwd=tmp,
                capture_output=True,
                text=True,
                check=False,
            )
        if result.returncode != 0 or not any(staged.glob("kafka_2.13-*.jar")):
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
            raise BrokerError(
                f"Maven could not fetch the Kafka {KAFKA_VERSION} jars (exit "
                f"{result.returncode}). Check access to Maven Central "
                f"(https://repo.maven.apache.org) or a mirror in ~/.m2/settings.xml.\n{tail}"
            )
        if libs.exists():  # a half-finished earlier fetch
            shutil.rmtree(libs)
        staged.rename(libs)
    marker.write_text("\n".join(sorted(p.name for p in libs.glob("*.jar"))) + "\n")
    console.print(f"Fetched {len(list(libs.glob('*.jar')))} jars into {libs}")
    return libs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
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
        return _pid_alive(self.pid)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (Kafka shuts down cleanly), then SIGKILL after `timeout`; never leaves it."""
        if not self.alive():
            return
        _signal_group(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _reap(self.pid)
            if not self.alive():
                return
            time.sleep(0.1)
        _signal_group(self.pid, signal.SIGKILL)
        for _ in range(50):
            _reap(self.pid)
            if not self.alive():
                return
            time.sleep(0.1)
        raise BrokerError(f"broker process {self.pid} did not exit; kill it by hand")

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        _signal_group(self.pid, signal.SIGKILL)
        for _ in range(50):
            _reap(self.pid)
            if not self.alive():
                return
            time.sleep(0.1)

    def save(self) -> None:
        (Path(self.data_dir) / STATE_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, data_dir: Path) -> "Broker | None":
        try:
            return cls(**json.loads((data_dir / STATE_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the broker leads its own process group
    except (ProcessLookupError, PermissionError):
        with suppress(ProcessLookupError):
            os.kill(pid, sig)


def _reap(pid: int) -> None:
    with suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _cluster_id() -> str:
    """What `kafka-storage random-uuid` prints: a base64url UUID without padding, and
    (as Kafka's own Uuid.randomUuid ensures) not starting with '-', which the format
    command's parser took for an option: one broker start in 64 failed that way."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


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
    libs = ensure_jars(console)
    java = find_java()
    if data_dir is None:
        (cache_root() / "brokers").mkdir(parents=True, exist_ok=True)
        data_dir = Path(tempfile.mkdtemp(prefix="broker-", dir=cache_root() / "brokers"))
    data_dir.mkdir(parents=True, exist_ok=True)
    previous = Broker.load(data_dir)
    if previous is not None and previous.alive():
        raise BrokerError(
            f"a broker already runs from {data_dir} at {previous.bootstrap} (pid "
            f"{previous.pid}); stop it first: runstate broker stop --dir {data_dir}"
        )
    log_dir = data_dir / "kraft-logs"
    config = data_dir / "server.properties"
    classpath = str(libs / "*")
    if not (log_dir / "meta.properties").exists():
        if previous is None:
            port = port or free_port()
            controller_port = controller_port or free_port()
        else:  # formatting failed last time; keep the address clients were told
            port, controller_port = previous.port, previous.controller_port
        config.write_text(
            _resource("server.properties.template")
            .read_text()
            .format(
                port=port,
                controller_port=controller_port,
                log_dir=log_dir,
                internal_partitions=internal_partitions,
            )
        )
        fmt = subprocess.run(
            [
                java,
                f"-Dlog4j2.configurationFile={_resource('log4j2-tools.properties')}",
                "-cp",
                classpath,
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                "-t",
                _cluster_id(),
                "-c",
                str(config),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if fmt.returncode != 0:
            raise BrokerError(
                f"formatting KRaft storage in {log_dir} failed:\n{fmt.stdout}{fmt.stderr}\n"
                "Use an empty directory (--dir) or delete this one."
            )
    else:
        if previous is None:
            raise BrokerError(f"{data_dir} holds KRaft data but no {STATE_FILE}; use a new --dir")
        port, controller_port = previous.port, previous.controller_port

    log_path = data_dir / "broker.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                java,
                "-Xms256m",
                "-Xmx1g",
                "-XX:+UseG1GC",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={_resource('log4j2-server.properties')}",
                "-cp",
                classpath,
                "kafka.Kafka",
                str(config),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() reaches everything
            preexec_fn=None if detach else die_with_parent,
        )
    broker = Broker(
        bootstrap=f"127.0.0.1:{port}",
        pid=process.pid,
        data_dir=str(data_dir),
        log_path=str(log_path),
        port=port,
        controller_port=controller_port,
    )
    broker.save()
    offset = log_path.stat().st_size
    deadline = time.monotonic() + timeout
    with console.status(f"Starting Kafka {KAFKA_VERSION} at {broker.bootstrap}"):
        while True:
            if process.poll() is not None:
                raise BrokerError(
                    f"the broker exited with code {process.returncode} while starting; its "
                    f"log ({log_path}) ends with:\n{_tail(log_path)}"
                )
            if _accepts(port) and READY_LINE in _read_from(log_path, offset):
                return broker
            if time.monotonic() > deadline:
                broker.stop()
                raise BrokerError(
                    f"the broker did not start within {timeout:.0f}s; its log ({log_path}) "
                    f"ends with:\n{_tail(log_path)}"
                )
            time.sleep(0.2)


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextmanager
def running_broker(
    data_dir: Path | None = None, *, console: Console | None = None
) -> Iterator[Broker]:
    """A broker for the length of a `with` block; stopped, reaped and, when the data
    directory was made here, deleted on exit."""
    own_dir = data_dir is None
    if data_dir is None:
        (cache_root() / "brokers").mkdir(parents=True, exist_ok=True)
        data_dir = Path(tempfile.mkdtemp(prefix="broker-", dir=cache_root() / "brokers"))
    try:
        broker = start_broker(data_dir, console=console)
        try:
            yield broker
        finally:
            broker.stop()
    finally:
        if own_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
