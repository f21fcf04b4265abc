"""The contenders: each drains a proposals topic into the output topics, as a process of
its own, until stopped. `start(name, setup)` starts one."""

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from benchmarks.quixenv import quix_python
from processor.kafka.topics import TopicNames
from processor.runtimes.children import die_with_parent
from processor.runtimes.native.process import WorkerProcess
from processor.trust.signatures import Algorithm

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Setup:
    bootstrap: str
    prefix: str
    keyring_path: Path
    workdir: Path
    group: str
    console: Console
    algorithm: Algorithm = Algorithm.ED25519  # what the input is signed with
    #: The workers' own signing key, for the deadlines they propose (an Ed25519 keyring
    #: holds no private key); None: the keyring's HMAC runtime key signs them.
    timer_key_path: Path | None = None

    @property
    def timer_key_args(self) -> tuple[str, ...]:
        return () if self.timer_key_path is None else ("--timer-key-file", str(self.timer_key_path))

    @property
    def names(self) -> TopicNames:
        return TopicNames.with_prefix(self.prefix)


class Running:
    """A contender's process: its memory, and a way to stop it."""

    def __init__(self, proc: "subprocess.Popen[bytes]", log: Path, stop: Callable[[], object]):
        self.proc, self.log, self._stop = proc, log, stop

    def memory_mb(self, field: str = "VmRSS") -> float:
        """Resident memory now (VmRSS) or at its peak (VmHWM), in MB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no {field} for pid {self.proc.pid}")

    def cpu_seconds(self) -> float:
        """CPU time (user + system, every thread) the process has used so far."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"contender exited {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        self._stop()


def _worker(runtime: str) -> Callable[[Setup], Running]:
    def start(setup: Setup) -> Running:
        log = setup.workdir / f"{runtime}.log"
        worker = WorkerProcess(
            bootstrap=setup.bootstrap,
            topic_prefix=setup.prefix,
            group_id=setup.group,
            state_dir=setup.workdir / "state",
            keyring_file=setup.keyring_path,
            log_path=log,
            extra_args=("--runtime", runtime, "--log-level", "warning", *setup.timer_key_args),
        )
        return Running(worker.proc, log, worker.terminate)

    return start


class Several(Running):
    """Processes of one consumer group, measured as one contender: memory adds up."""

    def __init__(self, members: list[Running]) -> None:
        super().__init__(members[0].proc, members[0].log, self._stop_all)
        self.members = members

    def memory_mb(self, field: str = "VmRSS") -> float:
        return sum(member.memory_mb(field) for member in self.members)

    def cpu_seconds(self) -> float:
        return sum(member.cpu_seconds() for member in self.members)

    def check_alive(self) -> None:
        for member in self.members:
            member.check_alive()

    def _stop_all(self) -> None:
        for member in self.members:
            member.stop()


def _workers(count: int, partitions: int = 3) -> Callable[[Setup], Running]:
    """`count` native workers in one group, each with a state dir of its own; returned
    once the group has settled (every partition owned, every worker owning some), so a
    drain does not time the rebalances of their joining."""

    def start(setup: Setup) -> Running:
        workers = [
            WorkerProcess(
                bootstrap=setup.bootstrap,
                topic_prefix=setup.prefix,
                group_id=setup.group,
                state_dir=setup.workdir / f"state-{n}",
                keyring_file=setup.keyring_path,
                log_path=setup.workdir / f"native-{n}.log",
                extra_args=("--runtime", "native", "--log-level", "warning", *setup.timer_key_args),
            )
            for n in range(count)
        ]
        several = Several([Running(w.proc, w.log_path, w.terminate) for w in workers])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            several.check_alive()
            owned = [len((w.health() or {}).get("partitions") or []) for w in workers]
            if sum(owned) == partitions and all(owned):
                return several
            time.sleep(0.2)
        several.stop()
        raise TimeoutError(f"{count} workers did not share {partitions} partitions in 120 s")

    return start


def _peer(module: str, python: Callable[[Console], Path | str]) -> Callable[[Setup], Running]:
    def start(setup: Setup) -> Running:
        log = setup.workdir / f"{module}.log"
        command = [
            str(python(setup.console)),
            "-m",
            f"benchmarks.peers.{module}",
            "--bootstrap",
            setup.bootstrap,
            "--prefix",
            setup.prefix,
            "--group",
            setup.group,
            "--keyring",
            str(setup.keyring_path),
            "--state-dir",
            str(setup.workdir / "state"),
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
        out = open(log, "wb")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )

        def stop() -> None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            out.close()

        return Running(proc, log, stop)

    return start


CONTENDERS: dict[str, Callable[[Setup], Running]] = {
    "ceiling": _peer("ceiling", lambda _console: sys.executable),
    "native": _worker("native"),
    "faust": _worker("faust"),
    "quix": _peer("quix_app", quix_python),
    "sqlite": _peer("sqlite_seed", lambda _console: sys.executable),
}
#: Not a contender of its own: the native worker scaled out, for the throughput table.
NATIVE_PAIR = _workers(2)
#: Not a contender of its own either: the native worker on input signed with HMAC (every
#: other row's input is signed with Ed25519, as `runstate keys generate` makes keys).
NATIVE_HMAC = "native · HMAC"

DESCRIPTIONS = {
    "ceiling": "confluent-kafka transactional passthrough, no state (the ceiling)",
    "native": "runstate worker (native, exactly once)",
    "faust": "runstate worker --runtime faust (at least once, recognisable repeats)",
    "quix": "Quix Streams app calling decide_record, RocksDB state, exactly once",
    "sqlite": "reference design: state machine in SQLite (a commit per write), at least once",
    "native ×2": "2 runstate worker processes (native) in one group, 3 partitions",
    NATIVE_HMAC: "runstate worker (native), the input signed with HMAC-SHA256",
}
