"""Decoded snapshots of the runs used lately, for every partition store of a process.

Decoding a snapshot's JSON dominates a lookup, so committed snapshots are kept decoded;
one takes about 6.5 KB (its JSON about 0.8 KB). The bound is the process's, not each
store's: a worker given 24 partitions keeps as many as one given 3 (a bound per store
made its memory grow with every partition it was assigned). The worker's loop and the
HTTP threads both use it: every call holds the lock."""

import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterable

from schemas.messages import RunSnapshot

#: Snapshots kept for the whole process (about 40 MB): as many as three partition stores
#: kept before the bound was the process's.
CAPACITY = 6_000


class SnapshotCache:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, str], RunSnapshot] = OrderedDict()
        self._lock = threading.Lock()
        self._owners = itertools.count(1)

    def owner(self) -> int:
        """A key space of its own, for one store."""
        return next(self._owners)

    def get(self, owner: int, run_id: str) -> RunSnapshot | None:
        with self._lock:
            found = self._entries.get((owner, run_id))
            if found is not None:
                self._entries.move_to_end((owner, run_id))
            return found

    def put(self, owner: int, snapshots: Iterable[RunSnapshot]) -> None:
        with self._lock:
            for snapshot in snapshots:
                key = (owner, snapshot.run_id)
                self._entries[key] = snapshot
                self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def drop(self, owner: int, run_ids: Iterable[str]) -> None:
        with self._lock:
            if self._entries:
                for run_id in run_ids:
                    self._entries.pop((owner, run_id), None)

    def drop_owner(self, owner: int) -> None:
        """Everything of one store (it closes, or restores over what it had)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == owner]:
                del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)

    def held(self, owner: int) -> int:
        with self._lock:
            return sum(1 for k in self._entries if k[0] == owner)


#: The process's cache, which every `PartitionStore` uses unless given another.
SNAPSHOTS = SnapshotCache()
