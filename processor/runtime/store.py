"""One RocksDB database (rocksdict) per assigned partition: the runs' snapshots, their
transition history, an index of their timers by due time, which timers already fired,
and the topic offsets the database reflects.

Writes are staged in memory while a Kafka transaction is open and reach RocksDB in a
single WriteBatch only after that transaction committed, together with the changelog
and transitions offsets they correspond to (DESIGN.md, Exactly once). So the database
is never ahead of Kafka: at worst behind, and restore catches it up.
"""

import json
import struct
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch

from processor.engine import Commit
from schemas.messages import RunSnapshot, Transition

_SNAPSHOT = b"s/"
_HISTORY = b"h/"
_OFFSET = b"o/"
_TIMER = b"t/"  # t/ + due (8 bytes, big-endian) + run id -> b""
_TIMER_OF = b"u/"  # u/ + run id -> JSON list of the run's index dues
_FIRED = b"f/"  # f/ + run id -> JSON {"revision": r, "names": [...]}
_CACHE_SIZE = 10_000

#: Changelog keys of fired marks: this prefix + run id (run ids never start with NUL).
FIRED_CHANGELOG_PREFIX = b"\x00fired\x00"


@dataclass(frozen=True)
class Fired:
    """Timers already fired for a run at `revision` (older revisions' marks are moot)."""

    revision: int
    names: frozenset[str]

    def covers(self, revision: int, name: str) -> bool:
        return self.revision == revision and name in self.names

    def with_name(self, revision: int, name: str) -> "Fired":
        names = self.names if self.revision == revision else frozenset()
        return Fired(revision, names | {name})

    def encode(self) -> bytes:
        return json.dumps({"revision": self.revision, "names": sorted(self.names)}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Fired":
        data = json.loads(raw)
        return cls(int(data["revision"]), frozenset(data["names"]))


NOT_FIRED = Fired(-1, frozenset())


def _run_key(run_id: str) -> bytes:
    return _SNAPSHOT + run_id.encode()


def _history_prefix(run_id: str) -> bytes:
    raw = run_id.encode()
    # Length-prefixed so no run id is a prefix of another's keys.
    return _HISTORY + struct.pack(">I", len(raw)) + raw


def _history_key(run_id: str, revision: int) -> bytes:
    return _history_prefix(run_id) + struct.pack(">Q", revision)


def _timer_key(due_ms: int, run_id: str) -> bytes:
    return _TIMER + struct.pack(">Q", max(0, due_ms)) + run_id.encode()


class PartitionStore:
    """The state of one input partition."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.path = path
        self._db = Rdict(str(path), options)
        self._staged: dict[str, RunSnapshot] = {}
        self._staged_json: dict[str, bytes] = {}
        self._staged_history: list[tuple[Transition, bytes]] = []
        self._staged_fired: dict[str, Fired] = {}
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
        return [Transition.model_validate_json(v) for v in self._scan(_history_prefix(run_id))]

    def offset(self, topic: str) -> int | None:
        """The next offset of `topic` (this partition) not yet reflected here."""
        raw = self._db.get(_OFFSET + topic.encode())
        return None if raw is None else int(raw)

    def runs(self) -> Iterable[RunSnapshot]:
        for value in self._scan(_SNAPSHOT):
            yield RunSnapshot.model_validate_json(value)

    def fired(self, run_id: str) -> Fired:
        staged = self._staged_fired.get(run_id)
        if staged is not None:
            return staged
        raw = self._db.get(_FIRED + run_id.encode())
        return NOT_FIRED if raw is None else Fired.decode(raw)

    def due_runs(self, now_ms: int) -> list[str]:
        """Runs with a timer due at or before `now_ms` that has not fired yet."""
        limit = _timer_key(now_ms + 1, "")
        runs = []
        for key in self._db.keys(from_key=_TIMER):
            if not (isinstance(key, bytes) and key.startswith(_TIMER)) or key >= limit:
                break
            runs.append(key[len(_TIMER) + 8 :].decode())
        return runs

    def _scan(self, prefix: bytes) -> Iterator[bytes]:
        for key, value in self._db.items(from_key=prefix):
            if not (isinstance(key, bytes) and key.startswith(prefix)):
                break
            yield value

    # -- writes ----------------------------------------------------------------
    def stage(
        self,
        commit: Commit,
        transition_json: bytes | None = None,
        snapshot_json: bytes | None = None,
    ) -> None:
        """Hold a commit until its transaction commits; pass the JSON already written to
        the topics, if at hand, so the flush does not encode it again."""
        run_id = commit.snapshot.run_id
        self._staged[run_id] = commit.snapshot
        self._staged_json[run_id] = snapshot_json or commit.snapshot.model_dump_json().encode()
        self._staged_history.append(
            (commit.transition, transition_json or commit.transition.model_dump_json().encode())
        )

    def stage_fired(self, run_id: str, revision: int, name: str) -> Fired:
        marks = self.fired(run_id).with_name(revision, name)
        self._staged_fired[run_id] = marks
        return marks

    def discard_staged(self) -> None:
        self._staged.clear()
        self._staged_json.clear()
        self._staged_history.clear()
        self._staged_fired.clear()

    def flush(self, offsets: dict[str, int]) -> None:
        """After the transaction committed: staged state and offsets, atomically."""
        if not (self._staged or self._staged_history or self._staged_fired or offsets):
            return
        batch = WriteBatch(raw_mode=True)
        for run_id, encoded in self._staged_json.items():
            batch.put(_run_key(run_id), encoded)
        for transition, encoded in self._staged_history:
            batch.put(_history_key(transition.run_id, transition.revision), encoded)
        for run_id, marks in self._staged_fired.items():
            batch.put(_FIRED + run_id.encode(), marks.encode())
        for run_id in set(self._staged) | set(self._staged_fired):
            self._reindex(batch, run_id, self.snapshot(run_id), self.fired(run_id))
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
        latest: dict[str, RunSnapshot | None] = {}
        marks: dict[str, Fired] = {}
        for key, value in snapshots:
            if key.startswith(FIRED_CHANGELOG_PREFIX):
                run_id = key[len(FIRED_CHANGELOG_PREFIX) :].decode()
                if value is not None:
                    marks[run_id] = Fired.decode(value)
                    batch.put(_FIRED + run_id.encode(), value)
                continue
            run_id = key.decode()
            self._cache.pop(run_id, None)
            if value is None:
                batch.delete(_run_key(run_id))
                latest[run_id] = None
            else:
                batch.put(_run_key(run_id), value)
                latest[run_id] = RunSnapshot.model_validate_json(value)
        for value in transitions:
            transition = Transition.model_validate_json(value)
            batch.put(_history_key(transition.run_id, transition.revision), value)
        for run_id in set(latest) | set(marks):
            snapshot = latest[run_id] if run_id in latest else self.committed_snapshot(run_id)
            self._reindex(batch, run_id, snapshot, marks.get(run_id) or self.fired(run_id))
        for topic, offset in offsets.items():
            batch.put(_OFFSET + topic.encode(), str(offset).encode())
        self._db.write(batch)

    def _reindex(
        self, batch: WriteBatch, run_id: str, snapshot: RunSnapshot | None, fired: Fired
    ) -> None:
        """Point the due-time index at the run's timers that have not fired."""
        old = self._db.get(_TIMER_OF + run_id.encode())
        for due in json.loads(old) if old is not None else []:
            batch.delete(_timer_key(due, run_id))
        timers = snapshot.timers if snapshot is not None else []
        dues = sorted({t.due_at_ms for t in timers if not fired.covers(t.revision, t.name)})
        for due in dues:
            batch.put(_timer_key(due, run_id), b"")
        batch.put(_TIMER_OF + run_id.encode(), json.dumps(dues).encode())

    def _remember(self, snapshot: RunSnapshot) -> None:
        self._cache[snapshot.run_id] = snapshot
        self._cache.move_to_end(snapshot.run_id)
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)

    def close(self) -> None:
        self.discard_staged()
        self._cache.clear()
        self._db.close()
