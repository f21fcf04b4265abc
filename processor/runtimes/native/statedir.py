"""A worker's state directory: one process at a time, a stable worker id, one RocksDB
database per input partition under <state dir>/<group>/<proposals topic>/p<N>."""

import fcntl
import uuid
from pathlib import Path
from typing import IO


class StateDirBusy(RuntimeError):
    pass


class StateDir:
    def __init__(self, state_dir: Path, group_id: str, proposals_topic: str) -> None:
        self.root = state_dir / group_id / proposals_topic
        self._lock: IO[str] | None = None

    def claim(self) -> "StateDir":
        """Lock it for this process (a second worker or a replay would corrupt it)."""
        self.root.mkdir(parents=True, exist_ok=True)
        lock = open(self.root / "LOCK", "w")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            lock.close()
            raise StateDirBusy(
                f"another process uses {self.root}; give each worker its own --state-dir "
                "and stop the worker before a replay"
            ) from exc
        self._lock = lock
        return self

    def worker_id(self, given: str | None) -> str:
        """The given id, else the one kept here, else a new one (then kept)."""
        id_file = self.root / "worker_id"
        if given is None:
            given = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(given)
        return given

    def partition(self, partition: int) -> Path:
        return self.root / f"p{partition}"

    def stores(self) -> list[Path]:
        """The partition stores kept here."""
        return sorted(p for p in self.root.glob("p[0-9]*") if p.is_dir())

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None
