"""One RocksDB database (rocksdict) per assigned partition: the runs' snapshots, their
transition history, every proposal id each run committed (dedupe for the run's life),
an index of their timers by due time, which timers already fired, and the topic
offsets the database reflects.

Writes are staged in memory while a Kafka transaction is open and reach RocksDB in a
single WriteBatch only after that transaction committed, together with the changelog
offset they correspond to. So the database is never ahead of Kafka:
at worst behind, and restore catches it up.

Keys: each kind of record has a namespace of its own, a two-byte tag (`s/`, `h/`, ...)
followed by fields of fixed width or length-prefixed, with the run id last; run ids
are valid UTF-8 without control characters (schemas.identifiers), so every key decodes
back to what it was made of. The layout's version is kept under `m/format` and checked
when a store opens: an older layout is rebuilt from the topics, a newer one refused.
"""

import json
import logging
import shutil
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocksdict import (
    BlockBasedOptions,
    Cache,
    Options,
    Rdict,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

from processor.engine import Beat, Commit
from processor.engine.answers import Answer, committed_digest
from processor.records.outputs import (
    ANSWER_CHANGELOG_PREFIX,
    FIRED_CHANGELOG_PREFIX,
    HISTORY_CHANGELOG_PREFIX,
    TimerMarks,
    Where,
    answer_changelog_key,
    parse_answer_changelog_key,
    parse_history_changelog_key,
    parse_index,
    parse_revision_header,
)
from processor.records.punctuator import NOT_FIRED, Fired
from processor.runtimes.native.snapshot_cache import SNAPSHOTS, SnapshotCache
from schemas.messages import Rejection, RunSnapshot, Transition

_SNAPSHOT = b"s/"
_HISTORY = b"h/"
_OFFSET = b"o/"
_TIMER = b"t/"  # t/ + due (8 bytes, big-endian) + run id -> b""
_TIMER_OF = b"u/"  # u/ + run id -> JSON list of the run's index dues
_FIRED = b"f/"  # f/ + run id -> JSON {"revision": r, "names": [...]}
_BY_STATE = b"i/"  # i/ + machine \0 state \0 + entered (8 bytes) + run id -> b""
_BY_STATE_OF = b"x/"  # x/ + run id -> its key in the by-state index
_REFUSALS = b"j/"  # j/ + run id (length-prefixed) + at (8 bytes) + proposal id -> Rejection
# p/ + run id (length-prefixed) + proposal id -> what the run answered it: the revision
# that committed it, or _REFUSED + the rejection (its answer for the run's life)
_PROPOSAL = b"p/"
_REFUSED = b"!"
_META = b"m/"  # m/ + name -> value (the layout's format version)
_FORMAT_KEY = _META + b"format"
#: The layout of keys and values described above. Raise it with any change to them.
#: 2: the proposal ids of every run (`p/`); fired marks name their timers' due times.
#: 3: history and proposal ids restored from the changelog's history records (a store
#: restores from the changelog alone); forgotten runs.
#: 4: refusals a run remembers, among its proposal ids (`p/`).
STORE_FORMAT = 4
log = logging.getLogger("runstate.store")
# Memory RocksDB may take as runs grow: one block cache shared by every partition store
# of the process, and small memtables per store (RocksDB's defaults: 64 MB, two of them,
# per store). Index and filter blocks stay outside the cache: charged to a cache this
# small they were evicted and re-read on every lookup.
# Both are small so that a worker's memory is flat soon after it starts: a worker fed
# 300 proposals/s (a soak worker's share) filled a 32 MB block cache over 6 minutes, and
# its three stores' memtables, 8 MB each, filled and flushed together, RSS swinging by
# 19 MB. With 8 MB and 4 MB the cache was full in 90 s and RSS stayed within 109-112 MB
# from then on. What the cache no longer holds, the OS's page cache still does (a read
# of it costs a system call). Restore's speed did not change; the native drain moved
# within its noise.
BLOCK_CACHE_BYTES = 8 << 20
_BLOCK_CACHE = Cache(BLOCK_CACHE_BYTES)
_WRITE_BUFFER_BYTES = 4 << 20
# And all memtables of the process together: past about 90 % of this RocksDB flushes the
# largest one, so the stores' memtables flush one at a time, not all at once, and the
# process holds about the same memtable memory throughout (24 partitions would otherwise
# hold up to 24 x 2 x 4 MB; with this many, each one's flushes are smaller).
_WRITE_BUFFERS = WriteBufferManager(8 << 20, False)
#: What `PartitionStore.memory` reports, by kind: RocksDB's own properties.
_MEMORY = {
    "memtables": "rocksdb.cur-size-all-mem-tables",
    "table_readers": "rocksdb.estimate-table-readers-mem",
    "block_cache": "rocksdb.block-cache-usage",
}


_NO_DUES = b"[]"
#: Restore's writes skip the write-ahead log (`PartitionStore.restore` says why it is
#: safe). Live commits keep it: skipping it there too (about 4 us a proposal) was
#: followed by a CI run with mismatched outcomes after a broker restart, not yet
#: explained. The log is probably not the cause: 22 runs of that scenario without it
#: passed, and a restart in place closes (flushes) the stores before its exec, so the
#: log plays no part there; only a process killed outright reads it back.
_UNLOGGED = WriteOptions()
_UNLOGGED.disable_wal = True  # type: ignore[method-assign,assignment]  # a property, not as stubbed

#: A changelog record as restore takes it: key, value and, if it has one, the header that
#: carries what the indexes need (INDEX_HEADER of a snapshot, REVISION_HEADER of history).
ChangelogRecord = tuple[bytes, bytes | None] | tuple[bytes, bytes | None, bytes | None]


def _timers_of(snapshot: RunSnapshot | None) -> list[tuple[int, int, str]]:
    timers = snapshot.timers if snapshot is not None else []
    return [(t.due_at_ms, t.revision, t.name) for t in timers]


def _index_fields(value: bytes, index: bytes | None = None) -> tuple[Where, TimerMarks]:
    """((machine, state, entered_state_at_ms), timers) of a snapshot record: from its
    index header, or, for a record written without one, from the snapshot itself."""
    if index is not None:
        return parse_index(index)
    data = json.loads(value)
    timers = [(t["due_at_ms"], t["revision"], t["name"]) for t in data.get("timers", [])]
    return (data["machine"], data["state"], data["entered_state_at_ms"]), timers


def _restored_index(value: bytes, header: bytes | None) -> tuple[Where, TimerMarks]:
    """`_index_fields`, reading the common header, a run without timers whose machine and
    state need no JSON escapes (`["machine","state",entered,[]]`), without the JSON
    decoder (header parsing measured a few microseconds a record on the 2-core benchmark
    machine: seconds of a 1M-run restore)."""
    if header is not None and header.startswith(b'["') and header.endswith(b",[]]"):
        names, sep, entered = header[2:-4].rpartition(b'",')
        machine, sep2, state = names.partition(b'","')
        if sep and sep2 and entered.isdigit() and b"\\" not in names and b'"' not in state:
            return (machine.decode(), state.decode(), int(entered)), []
    return _index_fields(value, header)


def _committed_by(value: bytes, header: bytes | None = None) -> tuple[int, str]:
    """(revision, proposal id) of a transition record: from its header, or from the
    record itself (a header written before it carried the proposal id)."""
    if header is not None:
        revision, proposal_id = parse_revision_header(header)
        if proposal_id is not None:
            return revision, proposal_id
    data = json.loads(value)
    return int(data["revision"]), str(data["proposal_id"])


_HISTORY_AT = len(HISTORY_CHANGELOG_PREFIX)
_LENGTH = struct.Struct(">I").pack


def _history_puts(
    key: bytes, value: bytes | None, header: bytes | None
) -> tuple[bytes, bytes, bytes] | None:
    """(history key, proposal key, its revision) of a changelog history record (`key`
    has HISTORY_CHANGELOG_PREFIX) in the common form, a value and a "<revision>
    <proposal id>" header agreeing with the key, from the record's bytes: no run id
    decoded and encoded again, no JSON. None for any other (`_restore_aside`'s checked
    path then takes it, and says what is wrong with it)."""
    if value is None or header is None:
        return None
    revision, _, proposal_id = header.partition(b" ")
    if not (proposal_id and revision.isdigit() and key[-9:-8] == b"\x00"):
        return None
    raw = key[_HISTORY_AT:-9]
    number = int(revision)
    if not raw or number != struct.unpack(">Q", key[-8:])[0]:
        return None
    raw.decode(), proposal_id.decode()  # identifiers are UTF-8: else a ValueError
    length = _LENGTH(len(raw))
    return (
        _HISTORY + length + raw + key[-8:],
        _PROPOSAL + length + raw + proposal_id,
        b"%d" % number,
    )


def _run_key(run_id: str) -> bytes:
    return _SNAPSHOT + run_id.encode()


def _history_prefix(run_id: str) -> bytes:
    raw = run_id.encode()
    # Length-prefixed so no run id is a prefix of another's keys.
    return _HISTORY + struct.pack(">I", len(raw)) + raw


def _history_key(run_id: str, revision: int) -> bytes:
    return _history_prefix(run_id) + struct.pack(">Q", revision)


def _proposals_prefix(run_id: str) -> bytes:
    raw = run_id.encode()
    return _PROPOSAL + struct.pack(">I", len(raw)) + raw


def _proposal_key(run_id: str, proposal_id: str) -> bytes:
    return _proposals_prefix(run_id) + proposal_id.encode()


def _past(prefix: bytes) -> bytes:
    """The end of a delete_range over every key that starts with `prefix` (what follows
    a prefix here is fixed-width numbers or UTF-8, never nine 0xFF bytes)."""
    return prefix + b"\xff" * 9


def _state_prefix(machine: str, state: str) -> bytes:
    return _BY_STATE + machine.encode() + b"\0" + state.encode() + b"\0"


def _state_key(machine: str, state: str, entered_ms: int, run_id: str) -> bytes:
    return _state_prefix(machine, state) + struct.pack(">Q", max(0, entered_ms)) + run_id.encode()


@dataclass(frozen=True)
class InState:
    """A run found by the by-state index: the oldest in a state come first."""

    entered_ms: int
    run_id: str
    machine: str
    state: str


def _refusals_prefix(run_id: str) -> bytes:
    raw = run_id.encode()
    return _REFUSALS + struct.pack(">I", len(raw)) + raw


def _timer_key(due_ms: int, run_id: str) -> bytes:
    return _TIMER + struct.pack(">Q", max(0, due_ms)) + run_id.encode()


class PartitionStore:
    """The state of one input partition."""

    def __init__(
        self,
        path: Path,
        snapshots: SnapshotCache = SNAPSHOTS,
        finished: Callable[[RunSnapshot], bool] = lambda snapshot: False,
    ) -> None:
        path.mkdir(parents=True, exist_ok=True)
        table = BlockBasedOptions()
        table.set_block_cache(_BLOCK_CACHE)
        # Most lookups of a new run miss (its snapshot, its timer index): a bloom filter
        # answers those without reading every level's blocks (1M runs: 5x slower without).
        table.set_bloom_filter(10, False)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_block_based_table_factory(table)
        options.set_write_buffer_size(_WRITE_BUFFER_BYTES)
        options.set_max_write_buffer_number(2)
        options.set_write_buffer_manager(_WRITE_BUFFERS)
        self.path = path
        self._db = self._open(path, options)
        self._closed = False
        # Runs per (machine, state), counted on first use and kept up to date by flush.
        self._counts: Counter[tuple[str, str]] | None = None
        # Decoding JSON dominates lookups: recently committed snapshots stay decoded, in
        # the process's cache (bounded for all stores at once).
        self._cache = snapshots
        self._cached = snapshots.owner()
        # Finished runs stay out of it: most runs a partition ever held are finished and
        # rarely asked for again, and kept they filled the cache with the past (a soak's
        # worker held about 11,000 runs after 7 minutes, 1,500 of them unfinished), so
        # the process grew for as long as that took, then kept 40 MB of it.
        self._finished = finished
        # Changelog records restore could not use (written by no runstate of this layout).
        self.unreadable = 0

    @staticmethod
    def _open(path: Path, options: Options) -> Rdict:
        """Open the store, checking its layout's version; an older layout is dropped (the
        changelog rebuilds it), a newer one refused."""
        db = Rdict(str(path), options)
        raw = db.get(_FORMAT_KEY)
        found = int(raw) if raw is not None else (None if _is_empty(db) else 1)
        if found is None or found == STORE_FORMAT:
            db.put(_FORMAT_KEY, str(STORE_FORMAT).encode())
            return db
        if found > STORE_FORMAT:
            db.close()
            raise StoreFormatError(
                f"the store at {path} has layout {found}, newer than this worker's "
                f"({STORE_FORMAT}): run the newer worker, or delete the directory to "
                "rebuild it from the topics"
            )
        log.warning(
            "store %s has layout %d (this worker writes %d): rebuilding it from the topics",
            path,
            found,
            STORE_FORMAT,
        )
        db.close()
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True, exist_ok=True)
        db = Rdict(str(path), options)
        db.put(_FORMAT_KEY, str(STORE_FORMAT).encode())
        return db

    # -- reads -----------------------------------------------------------------
    def begin(self, base: "PartitionTransaction | None" = None) -> "PartitionTransaction":
        """The changes of one Kafka transaction, written by its `flush` once it committed;
        over `base`, the previous transaction's changes while its commit travels."""
        return PartitionTransaction(self, base)

    def committed_snapshot(self, run_id: str) -> RunSnapshot | None:
        cached = self._cache.get(self._cached, run_id)
        if cached is not None:
            return cached
        generation = self._cache.generation(self._cached)  # before the read (see there)
        raw = self._db.get(_run_key(run_id))
        if raw is None:
            return None
        snapshot = RunSnapshot.model_validate_json(raw)
        if not self._finished(snapshot):
            self._cache.put_read(self._cached, snapshot, generation)
        return snapshot

    def refusals(self, run_id: str) -> list[Rejection]:
        """The run's refused proposals this store committed, oldest first (the inspector's
        timeline; not restored from the rejections topic)."""
        return [Rejection.model_validate_json(v) for v in self._scan(_refusals_prefix(run_id))]

    def history(self, run_id: str) -> list[Transition]:
        return [Transition.model_validate_json(v) for v in self._scan(_history_prefix(run_id))]

    def seen(self, run_id: str, proposal_id: str) -> Answer | None:
        """What the run answered `proposal_id`, for the run's life."""
        raw = self._db.get(_proposal_key(run_id, proposal_id))
        if raw is None:
            return None
        if raw[:1] == _REFUSED:
            rejection = Rejection.model_validate_json(raw[1:])
            return Answer(None, rejection.content_digest, rejection)
        revision = int(raw)
        return Answer(revision, self._digest_at(run_id, revision))

    def _digest_at(self, run_id: str, revision: int) -> str | None:
        raw = self._db.get(_history_key(run_id, revision))
        return None if raw is None else committed_digest(Transition.model_validate_json(raw))

    def answer_keys(self, run_id: str) -> list[bytes]:
        """The changelog keys of the refusals the run remembers."""
        prefix = _proposals_prefix(run_id)
        keys = []
        for key, value in self._db.items(from_key=prefix):
            if not (isinstance(key, bytes) and key.startswith(prefix)):
                break
            if isinstance(value, bytes) and value[:1] == _REFUSED:
                keys.append(answer_changelog_key(run_id, key[len(prefix) :].decode()))
        return keys

    def offset(self, topic: str) -> int | None:
        """The next offset of `topic` (this partition) not yet reflected here."""
        raw = self._db.get(_OFFSET + topic.encode())
        return None if raw is None else int(raw)

    def runs(self) -> Iterable[RunSnapshot]:
        for value in self._scan(_SNAPSHOT):
            yield RunSnapshot.model_validate_json(value)

    def memory(self) -> dict[str, int]:
        """Bytes RocksDB holds for this store outside Python's heap, by kind: its
        memtables, its table readers (index and filter blocks, outside the block cache),
        and the block cache (shared by every store of the process)."""
        return {kind: self._db.property_int_value(name) or 0 for kind, name in _MEMORY.items()}

    def state_counts(self) -> Counter[tuple[str, str]]:
        """Committed runs per (machine, state). The first call reads every snapshot (the
        worker makes it when it is assigned the partition); later flushes keep it."""
        if self._counts is None:
            counts: Counter[tuple[str, str]] = Counter()
            for value in self._scan(_SNAPSHOT):
                data = json.loads(value)
                counts[(data["machine"], data["state"])] += 1
            self._counts = counts
        return self._counts

    def fired(self, run_id: str) -> Fired:
        """The timers of the run marked fired, as committed."""
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

    def _get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """rocksdict's multi-get: a list of keys in, their values (or None) out. It lets
        the GIL go while RocksDB reads, so only restore's thread uses it, where the
        loop's thread may run meanwhile."""
        if not keys:
            return []
        found = self._db.get(list[Any](keys))
        assert isinstance(found, list)
        return found

    def _get_each(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of `keys` (or None), one get each, keeping the GIL: the loop's
        thread. A call that lets the GIL go must win it back, and while another thread
        (a commit's delivery reports, an HTTP reader) holds it that takes up to the
        switch interval, 5 ms: a multi-get took 420 us against a busy thread, a get
        0.6 us."""
        get = self._db.get
        return [get(key) for key in keys]

    def _scan(self, prefix: bytes) -> Iterator[bytes]:
        for key, value in self._db.items(from_key=prefix):
            if not (isinstance(key, bytes) and key.startswith(prefix)):
                break
            yield value

    # -- writes ----------------------------------------------------------------
    def write(self, changes: "PartitionTransaction", offsets: dict[str, int]) -> None:
        """A committed transaction's changes and the topic offsets they reach, atomically."""
        self.prepare(changes).apply(offsets)

    def prepare(self, changes: "PartitionTransaction") -> "PreparedWrite":
        """The WriteBatch of a transaction's changes, built but not written: the worker
        builds it while the Kafka transaction commits (the loop would otherwise only
        wait), and applies it once that commit succeeded, or drops it."""
        assert changes.base is None, "prepared over a transaction still committing"
        batch = WriteBatch(raw_mode=True)
        staged = changes.snapshots
        counts: Counter[tuple[str, str]] | None = None
        if self._counts is not None and not changes.empty:
            # A new Counter, not an update in place: HTTP threads may be reading the old.
            counts = self._counts.copy()
            for run_id in set(staged) | changes.forgotten:
                before = self.committed_snapshot(run_id)
                if before is not None:
                    counts[(before.machine, before.state)] -= 1
                snapshot = staged.get(run_id)
                if snapshot is not None:
                    counts[(snapshot.machine, snapshot.state)] += 1
            counts = +counts  # drops the zeros
        # Forgotten runs first: a run id created again in the same batch is a new run.
        for run_id in sorted(changes.forgotten):
            self._drop_run(batch, run_id)
        for run_id, encoded in changes.snapshot_json.items():
            batch.put(_run_key(run_id), encoded)
        runs = sorted(staged)
        for run_id, old in zip(
            runs, self._get_each([_BY_STATE_OF + r.encode() for r in runs]), strict=True
        ):
            if run_id in changes.forgotten:
                # Created again after it was forgotten: `_drop_run` deleted the old index
                # entry in this very batch (an entry equal to the new one was left out
                # of the index: found by the store property test).
                old = None
            snapshot = staged[run_id]
            self._index_state(
                batch, run_id, old, (snapshot.machine, snapshot.state, snapshot.entered_state_at_ms)
            )
        for transition, encoded in changes.history:
            batch.put(_history_key(transition.run_id, transition.revision), encoded)
            key = _proposal_key(transition.run_id, transition.proposal_id)
            batch.put(key, str(transition.revision).encode())
        for rejection, encoded in changes.refusals:
            key = _refusals_prefix(rejection.run_id or "") + struct.pack(">Q", rejection.at_ms)
            batch.put(key + (rejection.proposal_id or "").encode(), encoded)
        for (run_id, proposal_id), (_, encoded) in changes.answers.items():
            batch.put(_proposal_key(run_id, proposal_id), _REFUSED + encoded)
        for run_id, marks in changes.fired_marks.items():
            batch.put(_FIRED + run_id.encode(), marks.encode())
        changed = sorted(set(staged) | set(changes.fired_marks))
        olds = self._get_each([_TIMER_OF + r.encode() for r in changed])
        for run_id, old in zip(changed, olds, strict=True):
            old = None if run_id in changes.forgotten else old  # deleted above, as for states
            timers = _timers_of(changes.snapshot(run_id))
            if not timers and old in (None, _NO_DUES):
                continue  # no timers before or now: nothing to move (nor a fired mark read)
            self._reindex(batch, run_id, timers, changes.fired(run_id), old)
        return PreparedWrite(self, batch, changes, counts)

    def apply(self, prepared: "PreparedWrite", offsets: dict[str, int]) -> None:
        """Write a prepared batch with the topic offsets it reaches, atomically; the
        counts and the cache follow it."""
        if prepared.changes.empty and not offsets:
            return
        for topic, offset in offsets.items():
            prepared.batch.put(_OFFSET + topic.encode(), str(offset).encode())
        self._db.write(prepared.batch)
        if prepared.counts is not None:
            self._counts = prepared.counts
        kept: list[RunSnapshot] = []
        gone = list(prepared.changes.forgotten)
        for snapshot in prepared.changes.snapshots.values():
            if self._finished(snapshot):
                gone.append(snapshot.run_id)  # its unfinished self may be cached
            else:
                kept.append(snapshot)
        self._cache.drop(self._cached, gone)
        self._cache.put(self._cached, kept)

    def _drop_run(self, batch: WriteBatch, run_id: str) -> None:
        """Everything about a run, as written to `batch` (a forgotten run)."""
        raw = run_id.encode()
        for prefix in (
            _history_prefix(run_id),
            _proposals_prefix(run_id),
            _refusals_prefix(run_id),
        ):
            batch.delete_range(prefix, _past(prefix))
        batch.delete(_run_key(run_id))
        batch.delete(_FIRED + raw)
        by_state, dues = self._get_each([_BY_STATE_OF + raw, _TIMER_OF + raw])
        if by_state is not None:
            batch.delete(by_state)
            batch.delete(_BY_STATE_OF + raw)
        if dues is not None and dues != _NO_DUES:
            for due in json.loads(dues):
                batch.delete(_timer_key(due, run_id))
        batch.delete(_TIMER_OF + raw)

    def restore(self, records: Iterable[ChangelogRecord], offsets: dict[str, int]) -> None:
        """Apply records read back from the changelog: (key, value) and, when the record
        has one, its index header (INDEX_HEADER for a snapshot, REVISION_HEADER for a
        history record). Restore speed is decoding speed, so values are stored as read
        and what the indexes need comes from the headers (decoded from the value only
        without one). A run's tombstone (it was forgotten) drops all of it that came
        before; compaction later drops it from the changelog too.

        Written without the write-ahead log: `settle` makes it durable, and restore's
        caller settles before the store takes live (logged) writes. A crash before that
        loses a suffix of what restore wrote, offsets included (they are in the same
        batches, and memtables reach disk in order), so the next restore reads it again.
        """
        # A store catching up (the worker replaced its producer) may hold snapshots the
        # changelog has moved past since.
        self._cache.drop_owner(self._cached)
        batch = WriteBatch(raw_mode=True)
        counts = self._restore_counts()
        latest: dict[str, bytes | None] = {}
        marks: dict[str, Fired] = {}
        armed: dict[str, TimerMarks] = {}
        where_of: dict[str, Where] = {}
        for record in records:
            key, value = record[0], record[1]
            header = record[2] if len(record) > 2 else None
            try:
                if key[:1] == b"\x00" and self._restore_aside(batch, key, value, header, marks):
                    continue
                run_id = key.decode()
                if value is None:
                    where_of.pop(run_id, None)
                    armed.pop(run_id, None)
                    # Forgotten: what the records before this one put is dropped now, in
                    # order, so a run id created again after it starts afresh.
                    for prefix in (
                        _history_prefix(run_id),
                        _proposals_prefix(run_id),
                        _refusals_prefix(run_id),
                    ):
                        batch.delete_range(prefix, _past(prefix))
                else:
                    where_of[run_id], armed[run_id] = _restored_index(value, header)
                # Only a run's last snapshot of the batch is written and indexed.
                latest[run_id] = value
            except (ValueError, KeyError, TypeError) as exc:
                # Not written by this layout (a record by hand, or by an older version
                # that let a run id spell a prefix of these keys): skipped, not fatal.
                self.unreadable += 1
                log.error("store %s: changelog record %r skipped: %r", self.path, key[:80], exc)
        self._restore_indexes(batch, latest, where_of, armed, marks, counts)
        for topic, offset in offsets.items():
            batch.put(_OFFSET + topic.encode(), str(offset).encode())
        self._db.write(batch, _UNLOGGED)
        self._counts = None if counts is None else +counts  # a new one: HTTP threads read it

    def settle(self) -> None:
        """Make what `restore` wrote durable (it skips the write-ahead log)."""
        self._db.flush(True)

    def _restore_counts(self) -> Counter[tuple[str, str]] | None:
        """The runs per state that a restore batch keeps up to date (from the by-state
        index, without decoding a snapshot): the counted ones, or none at all in a store
        without runs (a restore from scratch); None when not counted yet."""
        if self._counts is not None:
            return self._counts.copy()
        first = next(iter(self._db.keys(from_key=_SNAPSHOT)), None)
        empty = not (isinstance(first, bytes) and first.startswith(_SNAPSHOT))
        return Counter() if empty else None

    def _restore_aside(
        self,
        batch: WriteBatch,
        key: bytes,
        value: bytes | None,
        header: bytes | None,
        marks: dict[str, Fired],
    ) -> bool:
        """A history record or fired marks restored; False for any other key."""
        if key.startswith(HISTORY_CHANGELOG_PREFIX):
            # Half of a restore's records are history: in the common form their store
            # keys are put together from the record's bytes (see `_history_puts`).
            puts = _history_puts(key, value, header)
            if puts is not None:
                batch.put(puts[0], value)
                batch.put(puts[1], puts[2])
                return True
            run_id, revision = parse_history_changelog_key(key)
            if value is None:
                batch.delete(_history_key(run_id, revision))
                return True
            committed, proposal_id = _committed_by(value, header)
            if committed != revision:
                raise ValueError(f"history key of revision {revision} holds {committed}")
            batch.put(_history_key(run_id, revision), value)
            batch.put(_proposal_key(run_id, proposal_id), str(revision).encode())
            return True
        if key.startswith(ANSWER_CHANGELOG_PREFIX):
            run_id, proposal_id = parse_answer_changelog_key(key)
            if value is None:
                batch.delete(_proposal_key(run_id, proposal_id))
            else:
                batch.put(_proposal_key(run_id, proposal_id), _REFUSED + value)
            return True
        if key.startswith(FIRED_CHANGELOG_PREFIX):
            run_id = key[len(FIRED_CHANGELOG_PREFIX) :].decode()
            if value is None:
                marks[run_id] = NOT_FIRED
                batch.delete(_FIRED + run_id.encode())
            else:
                marks[run_id] = Fired.decode(value)
                batch.put(_FIRED + run_id.encode(), value)
            return True
        return False

    def _restore_indexes(
        self,
        batch: WriteBatch,
        latest: dict[str, bytes | None],
        where_of: dict[str, Where],
        armed: dict[str, TimerMarks],
        marks: dict[str, Fired],
        counts: Counter[tuple[str, str]] | None,
    ) -> None:
        """The snapshots of a restore batch, the by-state and due-time indexes moved to
        them, and `counts` with them."""
        runs = sorted(latest)
        changed = sorted(set(latest) | set(marks))
        # One multi-get for what both indexes had, not a get per run and index.
        found = self._get_many(
            [_BY_STATE_OF + r.encode() for r in runs] + [_TIMER_OF + r.encode() for r in changed]
        )
        self._cache.drop(self._cached, runs)  # once a batch, not once a run
        for run_id, old in zip(runs, found, strict=False):
            value = latest[run_id]
            where = None if value is None else where_of[run_id]
            if value is None:
                batch.delete(_run_key(run_id))
            else:
                batch.put(_run_key(run_id), value)
            self._index_state(batch, run_id, old, where)
            if counts is not None:
                if old is not None:
                    machine, state, _ = old[len(_BY_STATE) :].split(b"\0", 2)
                    counts[(machine.decode(), state.decode())] -= 1
                if where is not None:
                    counts[where[:2]] += 1
        # Fired marks matter only to runs with timers: read for those alone.
        timers_of = {
            r: (armed.get(r, []) if r in latest else _timers_of(self.committed_snapshot(r)))
            for r in changed
        }
        timed = [r for r in changed if timers_of[r] and r not in marks]
        fired = dict(zip(timed, self._get_many([_FIRED + r.encode() for r in timed]), strict=True))
        for run_id, old in zip(changed, found[len(runs) :], strict=True):
            if not timers_of[run_id] and old is None:
                continue  # no timers before or now: an absent entry reads as no dues
            marked = marks.get(run_id)
            if marked is None:
                raw = fired.get(run_id)
                marked = NOT_FIRED if raw is None else Fired.decode(raw)
            self._reindex(batch, run_id, timers_of[run_id], marked, old)

    def _index_state(
        self,
        batch: WriteBatch,
        run_id: str,
        old: bytes | None,
        where: tuple[str, str, int] | None,
    ) -> None:
        """Move the run in the by-state index: `old` is its key there, `where` its
        (machine, state, entered_state_at_ms) now, None once it is gone."""
        new = None if where is None else _state_key(*where, run_id)
        if old is not None and old != new:
            batch.delete(old)
        if new is None:
            batch.delete(_BY_STATE_OF + run_id.encode())
        elif new != old:
            batch.put(new, b"")
            batch.put(_BY_STATE_OF + run_id.encode(), new)

    def in_state(
        self, machine: str, state: str, after: tuple[int, str] | None, limit: int
    ) -> list[InState]:
        """Committed runs of `machine` in `state`, longest there first, from after the
        (entered_ms, run_id) `after` on; at most `limit`."""
        prefix = _state_prefix(machine, state)
        start = prefix if after is None else _state_key(machine, state, after[0], after[1]) + b"\0"
        found: list[InState] = []
        for key in self._db.keys(from_key=start):
            if not (isinstance(key, bytes) and key.startswith(prefix)) or len(found) >= limit:
                break
            rest = key[len(prefix) :]
            entered = struct.unpack(">Q", rest[:8])[0]
            found.append(InState(entered, rest[8:].decode(), machine, state))
        return found

    def _reindex(
        self,
        batch: WriteBatch,
        run_id: str,
        timers: list[tuple[int, int, str]],
        fired: Fired,
        old: bytes | None,
    ) -> None:
        """Point the due-time index at the run's timers (due, revision, name) that have
        not fired; `old` is what the index held for the run."""
        dues = sorted(
            {due for due, revision, name in timers if not fired.covers(revision, name, due)}
        )
        encoded = json.dumps(dues).encode() if dues else _NO_DUES
        if encoded == (_NO_DUES if old is None else old):
            return  # the same due times: most commits keep the run's timers
        if old is not None and old != _NO_DUES:
            for due in json.loads(old):
                batch.delete(_timer_key(due, run_id))
        for due in dues:
            batch.put(_timer_key(due, run_id), b"")
        batch.put(_TIMER_OF + run_id.encode(), encoded)

    def close(self) -> None:
        """Flush and close; closing again does nothing (a rebalance and a cancelled
        catch-up may both let the same store go)."""
        if self._closed:
            return
        self._closed = True
        self._cache.drop_owner(self._cached)
        self._db.flush(True)  # the memtables to disk: a clean stop restores nothing
        self._db.close()


@dataclass
class PreparedWrite:
    """A transaction's changes as one WriteBatch, not yet written (see `prepare`)."""

    store: PartitionStore
    batch: WriteBatch
    changes: "PartitionTransaction"
    counts: Counter[tuple[str, str]] | None

    def apply(self, offsets: dict[str, int]) -> None:
        """Write the changes and the topic offsets they reach, atomically."""
        self.store.apply(self, offsets)


class PartitionTransaction:
    """What one Kafka transaction changes in a partition store, held in memory until the
    transaction committed (`flush`); an aborted transaction's is simply dropped. The
    engine decides against `snapshot`, which sees the transaction's own changes, so a
    run's proposals in one batch see each other."""

    def __init__(self, store: PartitionStore, base: "PartitionTransaction | None" = None) -> None:
        self.store = store
        #: The previous transaction while its commit travels: its changes are not in the
        #: store yet, so this one reads through them (`settled` cuts the link once they
        #: are).
        self.base = base
        self.snapshots: dict[str, RunSnapshot] = {}
        self.snapshot_json: dict[str, bytes] = {}
        self.history: list[tuple[Transition, bytes]] = []
        self.fired_marks: dict[str, Fired] = {}
        self.refusals: list[tuple[Rejection, bytes]] = []
        # (run, proposal id) -> the transition that committed it
        self.committed: dict[tuple[str, str], Transition] = {}
        # (run, proposal id) -> the refusal the run remembers, as published
        self.answers: dict[tuple[str, str], tuple[Rejection, bytes]] = {}
        self.forgotten: set[str] = set()  # runs dropped by this transaction (retention)

    @property
    def empty(self) -> bool:
        return not (
            self.snapshots
            or self.history
            or self.fired_marks
            or self.refusals
            or self.answers
            or self.forgotten
        )

    def snapshot(self, run_id: str) -> RunSnapshot | None:
        """The run as the engine must see it: this transaction's changes included."""
        staged = self.snapshots.get(run_id)
        if staged is not None or run_id in self.forgotten:
            return staged
        if self.base is not None:
            return self.base.snapshot(run_id)
        return self.store.committed_snapshot(run_id)

    def fired(self, run_id: str) -> Fired:
        staged = self.fired_marks.get(run_id)
        if staged is not None or run_id in self.forgotten:
            return staged or NOT_FIRED
        if self.base is not None:
            return self.base.fired(run_id)
        return self.store.fired(run_id)

    def seen(self, run_id: str, proposal_id: str) -> Answer | None:
        """What the run answered `proposal_id`: this transaction's answers included."""
        key = (run_id, proposal_id)
        staged = self.committed.get(key)
        if staged is not None:
            return Answer(staged.revision, committed_digest(staged))
        refused = self.answers.get(key)
        if refused is not None:
            return Answer(None, refused[0].content_digest, refused[0])
        if run_id in self.forgotten:
            return None
        if self.base is not None:
            return self.base.seen(run_id, proposal_id)
        return self.store.seen(run_id, proposal_id)

    def answer_keys(self, run_id: str) -> list[bytes]:
        """The changelog keys of the refusals the run remembers, staged ones included."""
        keys = (
            set()
            if run_id in self.forgotten
            else set(
                self.base.answer_keys(run_id)
                if self.base is not None
                else self.store.answer_keys(run_id)
            )
        )
        keys.update(answer_changelog_key(r, p) for r, p in self.answers if r == run_id)
        return sorted(keys)

    def settled(self) -> None:
        """The base transaction's changes reached the store: read the store again."""
        self.base = None

    def stage(
        self,
        commit: Commit,
        transition_json: bytes | None = None,
        snapshot_json: bytes | None = None,
    ) -> None:
        """A commit; pass the JSON already written to the topics, if at hand, so the
        flush does not encode it again."""
        run_id = commit.snapshot.run_id
        encoded_transition, encoded_snapshot = commit.encoded or (None, None)
        self.snapshots[run_id] = commit.snapshot
        self.snapshot_json[run_id] = (
            snapshot_json or encoded_snapshot or commit.snapshot.model_dump_json().encode()
        )
        self.history.append(
            (
                commit.transition,
                transition_json
                or encoded_transition
                or commit.transition.model_dump_json().encode(),
            )
        )
        self.committed[(run_id, commit.transition.proposal_id)] = commit.transition

    def stage_beat(self, beat: Beat, snapshot_json: bytes | None = None) -> None:
        """A heartbeat: the run's snapshot alive, its heartbeat deadline moved."""
        run_id = beat.snapshot.run_id
        self.snapshots[run_id] = beat.snapshot
        self.snapshot_json[run_id] = snapshot_json or beat.snapshot.model_dump_json().encode()

    def stage_forget(self, run_id: str) -> None:
        """A run forgotten (its machine's retention passed): all of it goes at flush,
        this transaction's own changes to it too."""
        self.forgotten.add(run_id)
        self.snapshots.pop(run_id, None)
        self.snapshot_json.pop(run_id, None)
        self.fired_marks.pop(run_id, None)
        self.history = [(t, raw) for t, raw in self.history if t.run_id != run_id]
        self.refusals = [(r, raw) for r, raw in self.refusals if r.run_id != run_id]
        self.committed = {k: v for k, v in self.committed.items() if k[0] != run_id}
        self.answers = {k: v for k, v in self.answers.items() if k[0] != run_id}

    def stage_refusal(self, rejection: Rejection, encoded: bytes | None = None) -> None:
        """A refused proposal of an existing run (the inspector's timeline), and, when
        the run remembers it (`content_digest`), its answer to the proposal id."""
        encoded = encoded or rejection.model_dump_json().encode()
        self.refusals.append((rejection, encoded))
        if rejection.content_digest is not None and rejection.run_id is not None:
            self.answers[(rejection.run_id, rejection.proposal_id or "")] = (rejection, encoded)

    def stage_fired(self, run_id: str, revision: int, name: str, due_ms: int) -> Fired:
        marks = self.fired(run_id).with_name(revision, name, due_ms)
        self.fired_marks[run_id] = marks
        return marks

    def flush(self, offsets: dict[str, int]) -> None:
        """After the Kafka transaction committed: the changes and offsets, in one batch."""
        self.store.write(self, offsets)

    def prepare(self) -> PreparedWrite:
        """The batch `flush` would write, built now and written by its `apply`."""
        return self.store.prepare(self)


class StoreFormatError(RuntimeError):
    """A state directory written by a newer runstate."""


def _is_empty(db: Rdict) -> bool:
    return next(iter(db.keys()), None) is None
