"""One RocksDB database (rocksdict) per assigned partition: the runs' snapshots, their
transition history, and the topic offsets the database reflects.

Writes are staged in memory while a Kafka transaction is open and reach RocksDB in a
single WriteBatch only after that transaction committed, together with the changelog
and transitions offsets they correspond to (DESIGN.md, Exactly once). So the database
is never ahead of Kafka: at worst behind, and restore catches it up.
"""

import struct
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch

from processor.engine import Commit
from schemas.messages import RunSnapshot, Transition

_SNAPSHOT = b"s/"
_HISTORY = b"h/"
_OFFSET = b"o/"
_CACHE_SIZE = 10_000


def _run_key(run_id: str) -> bytes:
    return _SNAPSHOT + run_id.encode()


def _history_prefix(run_id: str) -> bytes:
    raw = run_id.encode()
    # Length-prefixed so no run id is a prefix of another's keys.
    return _HISTORY + struct.pack(">I", len(raw)) + raw


def _history_key(run_id: str, revision: int) -> bytes:
    return _history_prefix(run_id) + struct.pack(">Q", revision)


class PartitionStore:
    """The state of one input partition."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.path = path
        self._db = Rdict(str(path), options)
        self._staged: dict[str, RunSnapshot] = {}
        self._staged_history: list[Transition] = []
        # Decoding JSON dominates lookups; keep recently committed snapshots decoded.
        self._cache: OrderedDict[str, RunSnapshot] = OrderedDict()

    # -- reads -----------------------------------------------------------------
    def snapshot(self, run_id: str) -> RunSnapshot | None:
        """The run as the engine must see it: staged (uncommitted) changes included."""
        staged = self._staged.get(run_id)
        return staged if staged is not None else self.committed_snapshot(run_id)

    def committed_snapshot(self, run_id: str) -> RunSnapshot | None:
        cached = self._cache.get(run_id)
        if cached is not None:
            self._cache.move_to_end(run_id)
            return cached
        raw = self._db.get(_run_key(run_id))
        if raw is None:
            return None
        snapshot = RunSnapshot.model_validate_json(raw)
        self._remember(snapshot)
        return snapshot

    def history(self, run_id: str) -> list[Transition]:
        prefix = _history_prefix(run_id)
        out = []
        for key, value in self._db.items(from_key=prefix):
            if not (isinstance(key, bytes) and key.startswith(prefix)):
                break
            out.append(Transition.model_validate_json(value))
        return out

    def offset(self, topic: str) -> int | None:
        """The next offset of `topic` (this partition) not yet reflected here."""
        raw = self._db.get(_OFFSET + topic.encode())
        return None if raw is None else int(raw)

    def runs(self) -> Iterable[RunSnapshot]:
        for key, value in self._db.items(from_key=_SNAPSHOT):
            if not (isinstance(key, bytes) and key.startswith(_SNAPSHOT)):
                break
            yield RunSnapshot.model_validate_json(value)

    # -- writes ----------------------------------------------------------------
    def stage(self, commit: Commit) -> None:
        self._staged[commit.snapshot.run_id] = commit.snapshot
        self._staged_history.append(commit.transition)

    def discard_staged(self) -> None:
        self._staged.clear()
        self._staged_history.clear()

    def flush(self, offsets: dict[str, int]) -> None:
        """After the transaction committed: staged state and offsets, atomically."""
        if not self._staged and not self._staged_history and not offsets:
            return
        batch = WriteBatch(raw_mode=True)
        for run_id, snapshot in self._staged.items():
            batch.put(_run_key(run_id), snapshot.model_dump_json().encode())
        for transition in self._staged_history:
            batch.put(
                _history_key(transition.run_id, transition.revision),
                transition.model_dump_json().encode(),
            )
        for topic, offset in offsets.items():
            batch.put(_OFFSET + topic.encode(), str(offset).encode())
        self._db.write(batch)
        for snapshot in self._staged.values():
            self._remember(snapshot)
        self.discard_staged()

    def restore(
        self,
        snapshots: Iterable[tuple[bytes, bytes | None]],
        transitions: Iterable[bytes],
        offsets: dict[str, int],
    ) -> None:
        """Apply records read back from the changelog and transitions topics."""
        batch = WriteBatch(raw_mode=True)
        for key, value in snapshots:
            run_id = key.decode()
            self._cache.pop(run_id, None)
            if value is None:
                batch.delete(_run_key(run_id))
            else:
                batch.put(_run_key(run_id), value)
        for value in transitions:
            transition = Transition.model_validate_json(value)
            batch.put(_history_key(transition.run_id, transition.revision), value)
        for topic, offset in offsets.items():
            batch.put(_OFFSET + topic.encode(), str(offset).encode())
        self._db.write(batch)

    def _remember(self, snapshot: RunSnapshot) -> None:
        self._cache[snapshot.run_id] = snapshot
        self._cache.move_to_end(snapshot.run_id)
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)

    def close(self) -> None:
        self.discard_staged()
        self._cache.clear()
        self._db.close()
