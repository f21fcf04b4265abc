"""Several worker processes of one group, and a paced feeder, for the fault scenarios."""

import random
import signal
import subprocess
import threading
import time
from typing import Any

from benchmarks.records import RawRecord
from tests.integration import harness
from tests.integration.harness import Env, WorkerProcess

RESTART_IN_PLACE = "restarting the worker in place"
PRODUCER_REPLACED = "replacing the producer"


def _why(worker: WorkerProcess) -> str:
    """The stacks faulthandler dumped (a crash, or SIGUSR1 before a kill), else the end
    of the worker's last traceback or of its log; without librdkafka noise."""
    text = worker.log_path.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if "rdkafka#" not in ln and not ln.startswith("%")]
    dumps = [i for i, ln in enumerate(lines) if ln.endswith("(most recent call first):")]
    if dumps:
        return "\n".join(lines[max(0, dumps[0] - 2) :][:80])
    tracebacks = [i for i, ln in enumerate(lines) if ln.startswith("Traceback")]
    return "\n".join(lines[tracebacks[-1] if tracebacks else 0 :][-12:])


class Cluster:
    """Workers in numbered slots; each slot keeps its state directory across restarts.
    A worker that exits without being told to is a crash."""

    def __init__(self, env: Env, runtime: str, *extra: str) -> None:
        self.env, self.runtime, self.extra = env, runtime, extra
        self.workers: dict[int, WorkerProcess] = {}
        self.crashes: list[str] = []
        self._expected_exit: set[int] = set()

    def start(self, slot: int) -> WorkerProcess:
        worker = WorkerProcess(
            self.env, self.env.tmp / f"slot-{slot}", *self.extra, runtime=self.runtime
        )
        self.workers[slot] = worker
        return worker

    def kill(self, slot: int) -> None:
        self.workers[slot].kill()

    def restart(self, slot: int) -> WorkerProcess:
        self.kill(slot)
        return self.start(slot)

    def stop(self, slot: int) -> None:
        worker = self.workers.pop(slot)
        try:
            code = worker.terminate()
        except subprocess.TimeoutExpired:
            worker.proc.send_signal(signal.SIGUSR1)  # its threads' stacks, into its log
            time.sleep(1.0)
            worker.kill()
            self.crashes.append(f"slot {slot} did not stop within 60 s of SIGTERM:\n{_why(worker)}")
            return
        if code != 0:
            self.crashes.append(f"slot {slot} exited {code} on SIGTERM:\n{_why(worker)}")

    def pause(self, slot: int) -> None:
        self.workers[slot].proc.send_signal(signal.SIGSTOP)

    def resume(self, slot: int) -> None:
        self.workers[slot].proc.send_signal(signal.SIGCONT)

    def transactional_id(self, slot: int) -> str:
        """The slot's worker's transactional.id (group id and the worker id it keeps in
        its state directory), once it has started."""
        group_dir = self.env.tmp / f"slot-{slot}" / self.env.group_id
        worker_id = next(group_dir.glob("*/worker_id")).read_text().strip()
        return f"{self.env.group_id}-{worker_id}"

    def random_slot(self, rng: random.Random) -> int:
        return rng.choice(sorted(self.workers))

    def live(self) -> list[WorkerProcess]:
        return list(self.workers.values())

    def note_crashes(self) -> None:
        """Workers that exited on their own since they were started."""
        for slot, worker in list(self.workers.items()):
            code = worker.proc.poll()
            if code is not None:
                self.crashes.append(f"slot {slot} exited {code}:\n{_why(worker)}")
                del self.workers[slot]

    def wait_owned(self, partitions: int, timeout: float = 120.0) -> None:
        """Until the live workers own every partition between them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            owned: set[int] = set()
            for worker in self.live():
                owned |= set((worker.health() or {}).get("partitions", []))
            if len(owned) == partitions:
                return
            time.sleep(0.2)
        raise TimeoutError(f"partitions not all owned within {timeout:.0f}s")

    def close(self) -> None:
        for slot in sorted(self.workers):
            self.stop(slot)

    def self_restarts(self) -> int:
        """Clients the workers gave up on and replaced (a librdkafka call that hung, or
        failed for good): a producer, or the whole worker restarted in place."""
        total = 0
        for path in self.env.tmp.glob("worker-*.log"):
            text = path.read_text(errors="replace")
            total += text.count(RESTART_IN_PLACE) + text.count(PRODUCER_REPLACED)
        return total


def signed_records(env: Env, plan: list[dict[str, Any]]) -> list[RawRecord]:
    """The workload as records, each signed with its principal's key."""
    return [RawRecord(k, v, h) for k, v, h in harness.signed_records(env, plan)]


class Feeder(threading.Thread):
    """Produces records at `rate` per second from one producer (each run's order kept)."""

    def __init__(self, env: Env, records: list[RawRecord], rate: float) -> None:
        super().__init__(daemon=True)
        self.env, self.records, self.rate = env, records, rate
        self.sent = 0
        self.last_sent = 0.0  # wall clock of the last record's send
        self.error: BaseException | None = None

    def run(self) -> None:
        # Deliveries outlast a broker restart (librdkafka's own default, 300 s): the
        # scenario, not the feeder, decides what a lost record is.
        client = self.env.client(timeout=300)
        try:
            started = time.monotonic()
            for n, record in enumerate(self.records):
                if n % 100 == 0:
                    ahead = n / self.rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
                client.send_raw(record.key, record.value, record.headers)  # type: ignore[arg-type]
                self.sent = n + 1
            self.last_sent = time.time()
            client.flush(300)
        except BaseException as exc:  # reported by the scenario
            self.error = exc
        finally:
            client.close()

    @property
    def seconds(self) -> float:
        return len(self.records) / self.rate
