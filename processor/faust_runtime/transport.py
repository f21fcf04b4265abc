"""Faust's aiokafka transport, with the proposals' positions under the agent's control.

- Seeking "to the committed offsets" also seeks partitions that never committed one,
  to their beginning (aiokafka leaves them wherever the fetcher got to), and records
  each partition's start as a floor for the agent (`positions`).
- Faust's read offsets are not kept for those topics (`ReadOffsets`).
- `commit_positions` commits the offsets the agent vouches for; Faust's own
  acknowledgements are off for the proposals topic because Faust acknowledges records
  it skipped around a rebalance.
"""

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    async def seek_to_committed(self) -> Mapping[TP, int]:
        consumer = self._ensure_consumer()
        committed: dict[Any, int | None] = dict(await self.call_thread(consumer.seek_to_committed))
        never = [tp for tp, offset in committed.items() if not offset]
        if never:
            beginnings = await self.call_thread(consumer.beginning_offsets, never)
            for tp in never:
                consumer.seek(tp, beginnings[tp])
                committed[tp] = beginnings[tp]
        floors = self.consumer.floors  # type: ignore[attr-defined]
        for tp, offset in committed.items():
            floors[TP(tp.topic, tp.partition)] = offset
        return committed  # type: ignore[return-value]


class ReadOffsets(defaultdict[TP, int | None]):
    """Faust's "read offsets", not kept for the topics whose positions the agent owns.

    Faust drops a fetched record below the read offset of its partition; after a seek
    back, records still in flight from before it raise that offset again and the
    records read anew are dropped. The agent skips what it has answered itself."""

    def __init__(self, agent_owned: set[str]) -> None:
        super().__init__(lambda: None)
        self.agent_owned = agent_owned

    def __setitem__(self, tp: TP, offset: int | None) -> None:
        if tp.topic not in self.agent_owned:
            super().__setitem__(tp, offset)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for tp, offset in dict(*args, **kwargs).items():
            self[tp] = offset


class Consumer(faust_aiokafka.Consumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # where each partition started at the latest seek to committed offsets
        self.floors: dict[TP, int] = {}
        # topics whose positions the agent owns (`positions`)
        self.agent_owned: set[str] = set()
        super().__init__(*args, **kwargs)
        self._read_offset = ReadOffsets(self.agent_owned)

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def commit_positions(self, offsets: Mapping[TP, int]) -> bool:
        """Commit these offsets (those of partitions no longer assigned are left out)."""
        return bool(await self._thread.commit(offsets))


class Transport(faust_aiokafka.Transport):
    Consumer = Consumer
