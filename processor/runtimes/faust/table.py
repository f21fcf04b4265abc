"""The Faust table of run snapshots, which also learns from its changelog how far each
proposals partition has been answered.

Every changelog record the Faust runtime writes carries the offset of the proposal that
made it (header `runstate-source-offset`). A worker that restores a partition from the
changelog therefore knows that every proposal up to the latest commit has its outcome
(the agent awaits each outcome in order): a floor for `positions`. Proposals after it
were refused or dead-lettered against the snapshot it left, so deciding them again gives
the same outcome, byte for byte.
"""

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import faust
from faust.types import TP, EventT
from rocksdict import WriteBatch

SOURCE_OFFSET_HEADER = "runstate-source-offset"
# Local only (never in the changelog), in each partition's store: the offset after the
# latest proposal answered, so a restart in place knows it even when recovery replays
# nothing.
NEXT_OFFSET_KEY = b"\x00next-offset\x00"
# Every proposal id a run committed, for the run's life (dedupe): in the table and its
# changelog, this prefix + run id + NUL + proposal id -> the revision that committed it.
_PROPOSAL_PREFIX = b"\x00proposal\x00"


def proposal_key(run_id: str, proposal_id: str) -> bytes:
    return proposals_prefix(run_id) + proposal_id.encode()


def proposals_prefix(run_id: str) -> bytes:
    return _PROPOSAL_PREFIX + run_id.encode() + b"\x00"


def source_offset_of(headers: Any) -> int | None:
    """The header's offset, from Faust's headers (a list of pairs or a mapping)."""
    pairs = headers.items() if isinstance(headers, dict) else (headers or ())
    for name, value in pairs:
        if name == SOURCE_OFFSET_HEADER:
            return int(value)
    return None


class NotHeld(RuntimeError):
    """A partition whose store this worker does not hold (revoked, or stopping)."""

    def __init__(self, partition: int) -> None:
        super().__init__(f"partition {partition}'s store is not held by this worker")
        self.partition = partition


class TableWrites:
    """A batch's writes to the table, in order, by partition (a value of None deletes the
    key): `RunsTable.write` applies each partition's as one RocksDB write batch, so a
    batch's records, its mark and its snapshots reach a partition's store at once."""

    def __init__(self) -> None:
        self.by_partition: dict[int, list[tuple[bytes, bytes | None]]] = {}

    def put(self, partition: int, key: bytes, value: bytes | None) -> None:
        writes = self.by_partition.get(partition)
        if writes is None:
            writes = self.by_partition[partition] = []
        writes.append((key, value))


class RunsTable(faust.Table):  # type: ignore[type-arg]
    """A Faust Table that also learns, while restoring from the changelog, the latest
    commit's source offset per partition; and reads and writes one partition's store
    outside an event (the timers' `PartitionView`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.latest_commit: dict[int, int] = {}
        self.recoveries = 0  # recoveries completed: the timers' index is rebuilt after each
        self.on_restored: Callable[[int], None] | None = None  # changelog records applied

    async def on_recovery_completed(self, active_tps: set[TP], standby_tps: set[TP]) -> None:
        await super().on_recovery_completed(active_tps, standby_tps)
        self.recoveries += 1

    def _partition_db(self, partition: int) -> Any:
        """The partition's open RocksDB (None when this worker does not hold it)."""
        return self.data._dbs.get(partition)  # type: ignore[attr-defined]

    def holds(self, partition: int) -> bool:
        return self._partition_db(partition) is not None

    def partition_get(self, partition: int, key: bytes) -> bytes | None:
        db = self._partition_db(partition)
        return None if db is None else db.get(key)

    def partition_read(self, partition: int, key: bytes) -> bytes | None:
        """`key` in the store of a partition this worker holds. Faust opens an active
        partition's store when it is assigned and drops it when the partition is revoked
        or the worker stops; it is never opened again here, where a store dropped
        meanwhile would be read without the writes it was not given since."""
        db = self._partition_db(partition)
        if db is None:
            raise NotHeld(partition)
        value: bytes | None = db.get(key)
        return value

    def partition_put(self, partition: int, key: bytes, value: bytes) -> None:
        db = self._partition_db(partition)
        if db is not None:  # revoked meanwhile: its new owner restores it from the changelog
            db.put(key, value)
            self.data._key_index[key] = partition  # type: ignore[attr-defined]

    def write(self, writes: TableWrites) -> set[int]:
        """`writes` applied, each partition's in one write batch (a put each was about
        6 % of the agent's main-thread samples, each its own write to the log); returns
        the partitions written. A partition revoked meanwhile (or a worker stopping) is
        skipped: its next owner restores it from the changelog."""
        written: set[int] = set()
        for partition, pairs in writes.by_partition.items():
            db = self._partition_db(partition)
            if db is None:
                continue
            written.add(partition)
            batch = WriteBatch(raw_mode=True)
            for key, value in pairs:
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
            db.write(batch)
        return written

    def partition_keys(self, partition: int, prefix: bytes) -> list[bytes]:
        """The partition's keys that start with `prefix`, in order."""
        db = self._partition_db(partition)
        found: list[bytes] = []
        if db is not None:
            for key in db.keys(from_key=prefix):
                if not (isinstance(key, bytes) and key.startswith(prefix)):
                    break
                found.append(key)
        return found

    def partition_items(self, partition: int) -> Iterator[tuple[bytes, bytes]]:
        db = self._partition_db(partition)
        if db is not None:
            yield from self.data._visible_items(db)  # type: ignore[attr-defined]

    def raise_mark(self, partition: int, next_offset: int) -> None:
        """The partition's local mark (`NEXT_OFFSET_KEY`) raised to `next_offset`, never
        lowered."""
        db = self.data._db_for_partition(partition)  # type: ignore[attr-defined]
        mark = db.get(NEXT_OFFSET_KEY)
        if mark is None or int(mark) < next_offset:
            db.put(NEXT_OFFSET_KEY, str(next_offset).encode())

    def note_commit(self, partition: int, offset: int) -> None:
        if offset > self.latest_commit.get(partition, -1):
            self.latest_commit[partition] = offset

    def apply_changelog_batch(self, batch: Iterable[EventT[Any]]) -> None:
        events = list(batch)
        latest: dict[int, int] = {}
        for event in events:
            offset = source_offset_of(event.message.headers)
            if offset is not None:
                partition = event.message.partition
                self.note_commit(partition, offset)
                latest[partition] = max(offset, latest.get(partition, -1))
        # The local mark too, before the records: a restart whose recovery replays
        # nothing (these records applied by a standby, or a recovery, of an earlier
        # process) still knows these proposals are answered; `latest_commit` is this
        # process's memory only. A mark ahead of its records is still true (a changelog
        # record exists only once its proposal's outputs were delivered).
        for partition, offset in latest.items():
            self.raise_mark(partition, offset + 1)
        super().apply_changelog_batch(events)
        if self.on_restored is not None:
            self.on_restored(len(events))
