"""The partition stores a worker owns, and the one lock under which HTTP threads read
them while the worker's loop adds, drops and writes them."""

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from processor.runtime.store import PartitionStore


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

    def close(self) -> None:
        self.drop(list(self._stores))

    def __len__(self) -> int:
        return len(self._stores)

    def __contains__(self, partition: int) -> bool:
        return partition in self._stores
