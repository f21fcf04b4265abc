"""One RocksDB database (rocksdict) per assigned partition: the runs' snapshots, their
transition history, every proposal id each run committed (dedupe for the run's life),
an index of their timers by due time, which timers already fired, and the topic
offsets the database reflects.

Writes are staged in memory while a Kafka transaction is open and reach RocksDB in a
single WriteBatch only after that transaction committed, together with the changelog
offset they correspond to. So the database is never ahead of Kafka:
at worst behind, and restore catches it up.

The keys are laid out in `keys.py`; the by-state and due-time indexes are kept by
`indexes.py`; restore turns changelog records into rows with `changelog.py`; one Kafka
transaction's staged changes are `changes.py`'s `PartitionTransaction`.
"""

import itertools
import json
import logging
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from rocksdict import WriteBatch

from processor.engine.answers import Answer, committed_digest
from processor.records.changelog_keys import answer_changelog_key
from processor.records.punctuator import NOT_FIRED, Fired
from processor.runtimes.native.snapshot_cache import SNAPSHOTS, SnapshotCache
from processor.runtimes.native.store.changelog import ChangelogBatch, ChangelogRecord
from processor.runtimes.native.store.changes import PartitionTransaction, PreparedWrite
from processor.runtimes.native.store.indexes import (
    NO_DUES,
    InState,
    index_state,
    reindex,
    snapshot_timers,
)
from processor.runtimes.native.store.keys import (
    BY_STATE_OF,
    FIRED,
    OFFSET,
    REFUSED,
    SNAPSHOT,
    TIMER,
    TIMER_OF,
    history_key,
    history_prefix,
    open_database,
    past,
    proposal_key,
    proposals_prefix,
    refusals_prefix,
    run_key,
    run_prefixes,
    state_key,
    state_prefix,
    timer_key,
)
from processor.runtimes.native.store.options import MEMORY, UNLOGGED, store_options
from schemas.messages import Rejection, RunSnapshot, Transition

log = logging.getLogger("runstate.store")


class PartitionStore:
    """The state of one input partition."""

    def __init__(
        self,
        path: Path,
        snapshots: SnapshotCache = SNAPSHOTS,
        finished: Callable[[RunSnapshot], bool] = lambda snapshot: False,
    ) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = open_database(path, store_options())
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
        raw = self._db.get(run_key(run_id))
        if raw is None:
            return None
        snapshot = RunSnapshot.model_validate_json(raw)
        if not self._finished(snapshot):
            self._cache.put_read(self._cached, snapshot, generation)
        return snapshot

    def refusals(self, run_id: str) -> list[Rejection]:
        """The run's refused proposals this store committed, oldest first (the inspector's
        timeline; not restored from the rejections topic)."""
        return [Rejection.model_validate_json(v) for v in self._scan(refusals_prefix(run_id))]

    def history(self, run_id: str) -> list[Transition]:
        return [Transition.model_validate_json(v) for v in self._scan(history_prefix(run_id))]

    def seen(self, run_id: str, proposal_id: str) -> Answer | None:
        """What the run answered `proposal_id`, for the run's life."""
        raw = self._db.get(proposal_key(run_id, proposal_id))
        if raw is None:
            return None
        if raw[:1] == REFUSED:
            rejection = Rejection.model_validate_json(raw[1:])
            return Answer(None, rejection.content_digest, rejection)
        revision = int(raw)
        return Answer(revision, self._digest_at(run_id, revision))

    def _digest_at(self, run_id: str, revision: int) -> str | None:
        raw = self._db.get(history_key(run_id, revision))
        return None if raw is None else committed_digest(Transition.model_validate_json(raw))

    def answer_keys(self, run_id: str) -> list[bytes]:
        """The changelog keys of the refusals the run remembers."""
        prefix = proposals_prefix(run_id)
        keys = []
        for key, value in self._db.items(from_key=prefix):
            if not (isinstance(key, bytes) and key.startswith(prefix)):
                break
            if isinstance(value, bytes) and value[:1] == REFUSED:
                keys.append(answer_changelog_key(run_id, key[len(prefix) :].decode()))
        return keys

    def offset(self, topic: str) -> int | None:
        """The next offset of `topic` (this partition) not yet reflected here."""
        raw = self._db.get(OFFSET + topic.encode())
        return None if raw is None else int(raw)

    def runs(self) -> Iterable[RunSnapshot]:
        for value in self._scan(SNAPSHOT):
            yield RunSnapshot.model_validate_json(value)

    def memory(self) -> dict[str, int]:
        """Bytes RocksDB holds for this store outside Python's heap, by kind: its
        memtables, its table readers (index and filter blocks, outside the block cache),
        and the block cache (shared by every store of the process)."""
        return {kind: self._db.property_int_value(name) or 0 for kind, name in MEMORY.items()}

    def state_counts(self) -> Counter[tuple[str, str]]:
        """Committed runs per (machine, state). The first call reads every snapshot (the
        worker makes it when it is assigned the partition); later flushes keep it."""
        if self._counts is None:
            counts: Counter[tuple[str, str]] = Counter()
            for value in self._scan(SNAPSHOT):
                data = json.loads(value)
                counts[(data["machine"], data["state"])] += 1
            self._counts = counts
        return self._counts

    def fired(self, run_id: str) -> Fired:
        """The timers of the run marked fired, as committed."""
        raw = self._db.get(FIRED + run_id.encode())
        return NOT_FIRED if raw is None else Fired.decode(raw)

    def due_runs(self, now_ms: int) -> list[str]:
        """Runs with a timer due at or before `now_ms` that has not fired yet."""
        limit = timer_key(now_ms + 1, "")
        runs = []
        for key in self._db.keys(from_key=TIMER):
            if not (isinstance(key, bytes) and key.startswith(TIMER)) or key >= limit:
                break
            runs.append(key[len(TIMER) + 8 :].decode())
        return runs

    def in_state(
        self,
        machine: str,
        state: str,
        after: tuple[int, str] | None,
        limit: int,
        newest: bool = False,
    ) -> list[InState]:
        """Committed runs of `machine` in `state`, longest there first (`newest`: the
        latest to enter first), from after the (entered_ms, run_id) `after` on; at most
        `limit`."""
        return list(itertools.islice(self.each_in_state(machine, state, after, newest), limit))

    def each_in_state(
        self, machine: str, state: str, after: tuple[int, str] | None, newest: bool
    ) -> Iterator[InState]:
        """`in_state`, read as it is taken: under the stores' lock, while it is held."""
        prefix = state_prefix(machine, state)
        cursor = None if after is None else state_key(machine, state, *after)
        if newest:  # from the end of the prefix (or the cursor's row) backwards
            start = past(prefix) if cursor is None else cursor
            keys = self._db.keys(from_key=start, backwards=True)
        else:  # from the start of the prefix (or just past the cursor's row)
            start = prefix if cursor is None else cursor + b"\0"
            keys = self._db.keys(from_key=start)
        for key in keys:
            if not (isinstance(key, bytes) and key.startswith(prefix)):
                return
            if newest and cursor is not None and key >= cursor:
                continue  # the cursor's own row
            rest = key[len(prefix) :]
            entered = struct.unpack(">Q", rest[:8])[0]
            yield InState(entered, rest[8:].decode(), machine, state)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
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
            batch.put(run_key(run_id), encoded)
        runs = sorted(staged)
        for run_id, old in zip(
            runs, self._get_each([BY_STATE_OF + r.encode() for r in runs]), strict=True
        ):
            if run_id in changes.forgotten:
                # Created again after it was forgotten: `_drop_run` deleted the old index
                # entry in this very batch, so the new one is written even when equal.
                old = None
            snapshot = staged[run_id]
            index_state(
                batch, run_id, old, (snapshot.machine, snapshot.state, snapshot.entered_state_at_ms)
            )
        for transition, encoded in changes.history:
            batch.put(history_key(transition.run_id, transition.revision), encoded)
            key = proposal_key(transition.run_id, transition.proposal_id)
            batch.put(key, str(transition.revision).encode())
        for rejection, encoded in changes.refusals:
            key = refusals_prefix(rejection.run_id or "") + struct.pack(">Q", rejection.at_ms)
            batch.put(key + (rejection.proposal_id or "").encode(), encoded)
        for (run_id, proposal_id), (_, encoded) in changes.answers.items():
            batch.put(proposal_key(run_id, proposal_id), REFUSED + encoded)
        for run_id, marks in changes.fired_marks.items():
            batch.put(FIRED + run_id.encode(), marks.encode())
        changed = sorted(set(staged) | set(changes.fired_marks))
        olds = self._get_each([TIMER_OF + r.encode() for r in changed])
        for run_id, old in zip(changed, olds, strict=True):
            old = None if run_id in changes.forgotten else old  # deleted above, as for states
            timers = snapshot_timers(changes.snapshot(run_id))
            if not timers and old in (None, NO_DUES):
                continue  # no timers before or now: nothing to move (nor a fired mark read)
            reindex(batch, run_id, timers, changes.fired(run_id), old)
        return PreparedWrite(self, batch, changes, counts)

    def apply(self, prepared: "PreparedWrite", offsets: dict[str, int]) -> None:
        """Write a prepared batch with the topic offsets it reaches, atomically; the
        counts and the cache follow it."""
        if prepared.changes.empty and not offsets:
            return
        for topic, offset in offsets.items():
            prepared.batch.put(OFFSET + topic.encode(), str(offset).encode())
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
        for prefix in run_prefixes(run_id):
            batch.delete_range(prefix, past(prefix))
        batch.delete(run_key(run_id))
        batch.delete(FIRED + raw)
        by_state, dues = self._get_each([BY_STATE_OF + raw, TIMER_OF + raw])
        if by_state is not None:
            batch.delete(by_state)
            batch.delete(BY_STATE_OF + raw)
        if dues is not None and dues != NO_DUES:
            for due in json.loads(dues):
                batch.delete(timer_key(due, run_id))
        batch.delete(TIMER_OF + raw)

    # -- restore ---------------------------------------------------------------
    def restore(self, records: Iterable[ChangelogRecord], offsets: dict[str, int]) -> None:
        """Apply records read back from the changelog: (key, value) and, when the record
        has one, its index header (INDEX_HEADER for a snapshot, REVISION_HEADER for a
        history record). Restore speed is decoding speed, so values are stored as read
        and what the indexes need comes from the headers (decoded from the value only
        without one). A run's tombstone (it was forgotten) drops all of it that came
        before; compaction later drops it from the changelog too.

        Written without the write-ahead log: `flush_restored` makes it durable, and restore's
        caller flushes before the store takes live (logged) writes. A crash before that
        loses a suffix of what restore wrote, offsets included (they are in the same
        batches, and memtables reach disk in order), so the next restore reads it again.
        """
        # A store catching up (the worker replaced its producer) may hold snapshots the
        # changelog has moved past since.
        self._cache.drop_owner(self._cached)
        restored = ChangelogBatch(self, self._restore_counts())
        for record in records:
            key, value = record[0], record[1]
            header = record[2] if len(record) > 2 else None
            try:
                restored.add(key, value, header)
            except (ValueError, KeyError, TypeError) as exc:
                # Not written by this layout (a record by hand, or by an older version
                # that let a run id spell a prefix of these keys): skipped, not fatal.
                self.unreadable += 1
                log.error("store %s: changelog record %r skipped: %r", self.path, key[:80], exc)
        restored.index()
        self._cache.drop(self._cached, restored.latest)  # once a batch, not once a run
        batch, counts = restored.batch, restored.counts
        for topic, offset in offsets.items():
            batch.put(OFFSET + topic.encode(), str(offset).encode())
        self._db.write(batch, UNLOGGED)
        self._counts = None if counts is None else +counts  # a new one: HTTP threads read it

    def flush_restored(self) -> None:
        """Make what `restore` wrote durable (it skips the write-ahead log)."""
        self._db.flush(True)

    def _restore_counts(self) -> Counter[tuple[str, str]] | None:
        """The runs per state that a restore batch keeps up to date (from the by-state
        index, without decoding a snapshot): the counted ones, or none at all in a store
        without runs (a restore from scratch); None when not counted yet."""
        if self._counts is not None:
            return self._counts.copy()
        first = next(iter(self._db.keys(from_key=SNAPSHOT)), None)
        empty = not (isinstance(first, bytes) and first.startswith(SNAPSHOT))
        return Counter() if empty else None

    def close(self) -> None:
        """Flush and close; closing again does nothing (a rebalance and a cancelled
        catch-up may both let the same store go)."""
        if self._closed:
            return
        self._closed = True
        self._cache.drop_owner(self._cached)
        self._db.flush(True)  # the memtables to disk: a clean stop restores nothing
        self._db.close()
