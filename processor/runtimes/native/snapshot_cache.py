"""Decoded snapshots of the runs used lately, for every partition store of a process.
The stores a worker opens keep finished runs (in a terminal state) out of it.

Decoding a snapshot's JSON dominates a lookup, so committed snapshots are kept decoded;
one takes about 3 KB (its JSON about 0.7 KB; see below). The bound is the process's, not each
store's: a worker given 24 partitions keeps as many as one given 3 (a bound per store
made its memory grow with every partition it was assigned). The worker's loop and the
HTTP threads both use it: every call holds the lock.

A snapshot read from a store's database goes in only if that store wrote nothing since
the read began (`generation`, `put_read`): else an HTTP thread that read a run just
before a commit wrote it could put the older snapshot back over the newer one, and the
engine would decide the run's next proposal from it.

Of a decoded snapshot's bytes, 2.2 KB were the set of its field names pydantic keeps
beside each model (`__pydantic_fields_set__`: every field, for a snapshot read back). A
cached snapshot holds the one set its class shares instead (`compact`), as the engine's
own snapshots do: that took a cached snapshot from about 5.2 to 3.0 KB.

A run not used for `IDLE_S` leaves the cache, whatever the count: runs parked for a person's
approval or a long tool call would otherwise fill it to its bound over tens of minutes
(about 7 a second per worker in the soak), so a worker's memory kept rising long after
its start. With the expiry the cache holds the runs of the last minute, a level a steady
load reaches in about a minute; a run that comes back later costs one read and decode.
"""

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from schemas.messages import RunSnapshot

#: Snapshots kept for the whole process (about 18 MB): as many as three partition stores
#: kept before the bound was the process's.
CAPACITY = 6_000

#: Seconds a run stays cached after its last use.
IDLE_S = 60.0


class SnapshotCache:
    def __init__(
        self,
        capacity: int = CAPACITY,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity, self.idle_s, self._clock = capacity, idle_s, clock
        # Least recently used first: each with the time of its last use.
        self._entries: OrderedDict[tuple[int, str], tuple[RunSnapshot, float]] = OrderedDict()
        self._lock = threading.Lock()
        self._owners = itertools.count(1)
        self._generations: dict[int, int] = {}  # owner -> writes so far

    def owner(self) -> int:
        """A key space of its own, for one store."""
        return next(self._owners)

    def get(self, owner: int, run_id: str) -> RunSnapshot | None:
        key = (owner, run_id)
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            now = self._clock()
            if now - found[1] > self.idle_s:
                del self._entries[key]
                return None
            self._entries[key] = (found[0], now)
            self._entries.move_to_end(key)
            return found[0]

    def generation(self, owner: int) -> int:
        """The store's writes so far: take it before reading the database."""
        with self._lock:
            return self._generations.get(owner, 0)

    def put_read(self, owner: int, snapshot: RunSnapshot, generation: int) -> None:
        """A snapshot read from the store's database, kept unless the store wrote since
        `generation` or the run is cached already (what a write put there is newer)."""
        key = (owner, snapshot.run_id)
        with self._lock:
            now = self._clock()
            self._trim(now)  # a run idle too long is not there to keep
            if self._generations.get(owner, 0) == generation and key not in self._entries:
                self._entries[key] = (snapshot.compact(), now)
                self._trim(now)

    def put(self, owner: int, snapshots: Iterable[RunSnapshot]) -> None:
        """What the store just wrote."""
        with self._lock:
            self._wrote(owner)
            now = self._clock()
            for snapshot in snapshots:
                key = (owner, snapshot.run_id)
                self._entries[key] = (snapshot.compact(), now)
                self._entries.move_to_end(key)
            self._trim(now)

    def _trim(self, now: float) -> None:
        """Past the bound, or idle too long: both from the least recently used end (its
        times only rise along the order, so every idle run goes)."""
        entries = self._entries
        while entries and (
            len(entries) > self.capacity or now - next(iter(entries.values()))[1] > self.idle_s
        ):
            entries.popitem(last=False)

    def _wrote(self, owner: int) -> None:
        self._generations[owner] = self._generations.get(owner, 0) + 1

    def drop(self, owner: int, run_ids: Iterable[str]) -> None:
        with self._lock:
            self._wrote(owner)
            if self._entries:
                for run_id in run_ids:
                    self._entries.pop((owner, run_id), None)

    def drop_owner(self, owner: int) -> None:
        """Everything of one store (it closes, or restores over what it had)."""
        with self._lock:
            self._wrote(owner)
            for key in [k for k in self._entries if k[0] == owner]:
                del self._entries[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def held(self, owner: int) -> int:
        with self._lock:
            return sum(1 for k in self._entries if k[0] == owner)


#: The process's cache, which every `PartitionStore` uses unless given another.
SNAPSHOTS = SnapshotCache()
