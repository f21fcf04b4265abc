"""Where each proposals partition stands, owned by the Faust agent rather than by Faust.

Faust drops records it has fetched in several places around a rebalance (a batch cut
short when its flow stops, events skipped and acknowledged while flow control is
paused, records below a stale read offset after a seek) and can commit offsets past
them. So the Faust runtime turns Faust's acknowledgements off for the proposals topic
and keeps, per partition, `next`: the lowest offset whose outcome may not have been
delivered. Every source of it is a lower bound that is true forever (an offset once
answered stays answered): the offset committed by this runtime, the local mark written
after each outcome, and the latest commit restored from the changelog. A record below
`next` is skipped; a record above it means records were dropped, and the agent seeks
back. Pure bookkeeping: no I/O, no clock.
"""

from dataclasses import dataclass, field
from enum import Enum


class Verdict(Enum):
    DECIDE = "decide"  # the next record: decide it
    SKIP = "skip"  # its outcome was delivered before
    SEEK = "seek"  # records before it were dropped: seek back to `next`
    WAIT = "wait"  # a seek back is on its way; ignore until it arrives


# Ignored records after which a seek back is asked for again, in case it was lost.
RESEEK_AFTER = 1_000


@dataclass
class _Seek:
    to: int  # `next` when the seek was asked for
    first_seen: int  # the record above it that showed the gap
    generation: int
    ignored: int = 0


@dataclass
class Positions:
    next: dict[int, int] = field(default_factory=dict)
    _seeks: dict[int, _Seek] = field(default_factory=dict)
    # Per partition, the offset after the last record taken into the batch being decided
    # (not delivered yet): the next record to take is the one after it.
    _taken: dict[int, int] = field(default_factory=dict)

    def learn(self, partition: int, floor: int) -> None:
        """Every offset below `floor` has had its outcome delivered."""
        if floor > self.next.get(partition, -1):
            self.next[partition] = floor
            self._seeks.pop(partition, None)

    def known(self, partition: int) -> bool:
        return partition in self.next

    def take(self, partition: int, last: int) -> None:
        """The records up to `last` are taken into the batch being decided."""
        self._taken[partition] = last + 1

    def release(self) -> None:
        """The batch is over: delivered (`decided` learned it) or given up (its records
        are decided again when read again)."""
        self._taken.clear()

    def classify(self, partition: int, offset: int, generation: int) -> Verdict:
        expected = max(self.next[partition], self._taken.get(partition, -1))
        if offset < expected:
            return Verdict.SKIP
        if offset == expected:
            self._seeks.pop(partition, None)
            return Verdict.DECIDE
        seek = self._seeks.get(partition)
        if seek is None or seek.to != expected or seek.generation != generation:
            self._seeks[partition] = _Seek(expected, offset, generation)
            return Verdict.SEEK
        if offset <= seek.first_seen:
            # The first record read again after the seek: records come in offset order,
            # so the offsets between hold none (transaction markers, aborted records).
            self.learn(partition, offset)
            return Verdict.DECIDE
        # read before the seek took effect
        seek.ignored += 1
        return Verdict.SEEK if seek.ignored % RESEEK_AFTER == 0 else Verdict.WAIT

    def decided(self, partition: int, offset: int) -> None:
        """The outcome of `offset` is delivered."""
        self.learn(partition, offset + 1)
