"""Snapshots of the runs used lately, decoded, each beside the bytes it was decoded
from: decoding a snapshot's JSON dominated a lookup.

A lookup still reads the table (a few µs) and returns the decoded snapshot only when
the bytes read are the bytes it was decoded from, so whatever wrote the table (a commit,
a restore from the changelog, another worker's outcomes restored after a move) can
never be answered with an older snapshot. A commit puts the snapshot it wrote, so the
run's next proposal finds it decoded.
"""

from collections import OrderedDict

from schemas.messages import RunSnapshot

#: Snapshots kept (about 3.7 KB each, with their bytes), least recently used first out.
CAPACITY = 6_000


class DecodedSnapshots:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, str], tuple[bytes, RunSnapshot]] = OrderedDict()

    def decode(self, partition: int, run_id: str, raw: bytes) -> RunSnapshot:
        """The snapshot `raw` holds: the one decoded before from the same bytes, or
        decoded now."""
        key = (partition, run_id)
        found = self._entries.get(key)
        if found is not None and found[0] == raw:
            self._entries.move_to_end(key)
            return found[1]
        snapshot = RunSnapshot.model_validate_json(raw)
        self.put(partition, raw, snapshot)
        return snapshot

    def put(self, partition: int, raw: bytes, snapshot: RunSnapshot) -> None:
        """`snapshot`, whose bytes are `raw` (what a commit writes to the table)."""
        key = (partition, snapshot.run_id)
        self._entries[key] = (raw, snapshot.compact())
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def drop(self, partition: int, run_id: str) -> None:
        self._entries.pop((partition, run_id), None)

    def __len__(self) -> int:
        return len(self._entries)
