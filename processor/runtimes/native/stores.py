"""The partition stores a worker owns, the one lock under which HTTP threads read
them while the worker's loop adds, drops and writes them, and the questions asked of
all of them at once (runs per state, runs in a state)."""

import heapq
import itertools
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from processor.engine import Machine
from processor.runtimes.native.store.indexes import InState
from processor.runtimes.native.store.partition import PartitionStore
from processor.serving.peers import StateQuery, StateStats


class StoreRegistry:
    def __init__(self) -> None:
        self._stores: dict[int, PartitionStore] = {}
        self.lock = threading.RLock()

    def get(self, partition: int) -> PartitionStore | None:
        """For the worker's loop, which alone adds and drops stores."""
        return self._stores.get(partition)

    def owned(self) -> list[int]:
        with self.lock:
            return sorted(self._stores)

    def all(self) -> list[PartitionStore]:
        with self.lock:
            return list(self._stores.values())

    def items(self) -> list[tuple[int, PartitionStore]]:
        with self.lock:
            return sorted(self._stores.items())

    @contextmanager
    def reading(self, partition: int) -> Iterator[PartitionStore | None]:
        """The partition's store (None when not owned), kept open while the block runs."""
        with self.lock:
            yield self._stores.get(partition)

    def add(self, stores: Mapping[int, PartitionStore]) -> None:
        with self.lock:
            self._stores.update(stores)

    def drop(self, partitions: list[int]) -> None:
        with self.lock:
            for partition in partitions:
                store = self._stores.pop(partition, None)
                if store is not None:
                    store.close()

    def take(self, partitions: list[int]) -> dict[int, PartitionStore]:
        """The partitions' stores, no longer owned but still open (to catch up)."""
        with self.lock:
            return {p: self._stores.pop(p) for p in partitions if p in self._stores}

    def close(self) -> None:
        self.drop(list(self._stores))

    # -- over every owned store, under the lock --------------------------------------
    def runs_by_state(self, machines: Mapping[str, Machine]) -> Iterator[tuple[str, str, int]]:
        """(machine, state, runs) over the owned partitions; every state of every machine,
        zeros included (the metrics' gauge)."""
        with self.lock:
            counts = [store.state_counts() for store in self._stores.values()]
        for name, machine in sorted(machines.items()):
            for state in machine.spec.states:
                yield name, state, sum(c[(name, state)] for c in counts)

    def memory(self) -> dict[str, int]:
        """RocksDB's memory over the owned stores, by kind (PartitionStore.memory); the
        block cache is one, shared, so it is counted once."""
        with self.lock:
            each = [store.memory() for store in self._stores.values()]
        total = {kind: sum(m[kind] for m in each) for kind in ("memtables", "table_readers")}
        total["block_cache"] = max((m["block_cache"] for m in each), default=0)
        return total

    def runs_in_state(self, machines: Mapping[str, Machine], query: StateQuery) -> list[InState]:
        """The committed runs the query asks for, in its order."""
        with self.lock:  # each (store, state) read in order, merged, `limit` taken
            ordered = [
                store.each_in_state(name, state, query.after, query.newest)
                for store in self._stores.values()
                for name, state in query.states(machines)
            ]
            merged = heapq.merge(*ordered, key=_entry, reverse=query.newest)
            return list(itertools.islice(merged, query.limit))

    def local_stats(self, machines: Mapping[str, Machine]) -> list[StateStats]:
        """(machine, state, runs, oldest entered_state_at_ms), every state of every machine."""
        rows = []
        with self.lock:
            stores = list(self._stores.values())
            for name, machine in sorted(machines.items()):
                for state in machine.spec.states:
                    runs = sum(store.state_counts()[(name, state)] for store in stores)
                    oldest = [
                        r.entered_ms for st in stores for r in st.in_state(name, state, None, 1)
                    ]
                    rows.append((name, state, runs, min(oldest) if oldest else None))
        return rows

    def __len__(self) -> int:
        return len(self._stores)

    def __contains__(self, partition: int) -> bool:
        return partition in self._stores


def _entry(run: InState) -> tuple[int, str]:
    return run.entered_ms, run.run_id
