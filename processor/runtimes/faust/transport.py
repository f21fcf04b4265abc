"""Faust's aiokafka transport, with the proposals' positions under the agent's control.

- Every seek runs on the consumer's own thread. aiokafka's consumer is not thread-safe:
  a seek drops the partition's fetched records and wakes the fetch routine, state the
  consumer thread reads and writes without a lock (Faust seeks from the app's thread,
  and a fetch racing such a seek fails with a KeyError that ends Faust's fetcher).
- Seeking "to the committed offsets" also seeks partitions that never committed one,
  to their beginning (aiokafka leaves them wherever the fetcher got to), and records
  each partition's start as a floor for the agent (`positions`).
- A fetch that fails other than by a stop does not leave the worker up and silent
  (Faust's fetcher would end, and nothing would be read again): it is logged, shown
  on /readyz, and fetching starts again from the offsets the agent vouches for
  (`refetch`).
- Faust's read offsets are not kept for those topics (`ReadOffsets`).
- The fetch loop runs the conductor's delivery of each record on the loop's own task,
  and makes a task of a delivery only when it waits (`inline.py`); Faust's fetch loop
  made a task of each, and waited for it with three more futures.
- `commit_positions` commits the offsets the agent vouches for; Faust's own
  acknowledgements are off for the proposals topic because Faust acknowledges records
  it skipped around a rebalance.
- A record batch of those topics that cannot be read (a codec whose library is missing,
  a checksum that does not match, bytes the codec refuses) becomes one stand-in record
  (`Unreadable`) at its first offset, which the agent sends to the DLQ with the reason,
  instead of an exception that stops the worker (aiokafka raises it from the fetch, and
  Faust's fetcher crashes the app with it). Such an error on any other topic (the
  changelog), or one no batch can be named for (a batch header that cannot be parsed),
  is logged and the fetch retried each second: the worker stays up, that partition waits.
"""

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from aiokafka import errors as aiokafka_errors
from aiokafka.consumer import fetcher as aiokafka_fetcher
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from processor.runtimes.faust.inline import finish, start_inline

log = logging.getLogger("runstate.faust")

# What aiokafka raises for bytes it cannot turn into records.
READ_ERRORS = (aiokafka_errors.CorruptRecordException, aiokafka_errors.UnsupportedCodecError)
READ_RETRY_S = 1.0
#: Records delivered between two returns to the event loop (Faust's figure).
DELIVER_YIELD_EVERY = 100
#: How long /readyz shows a failed fetch (fetching fails again each READ_RETRY_S while
#: the cause lasts, so a lasting one keeps the worker not ready).
FAILED_FETCH_SHOWN_S = 15.0


@dataclass(frozen=True)
class Unreadable:
    """Stands for the records `first`..`last` of a batch that could not be read. It
    travels as the stand-in record's `checksum`, where no producer can put an object."""

    first: int
    last: int
    reason: str


@dataclass(frozen=True)
class _StandIn:
    """A record for aiokafka's `_consumer_record`: no key, no value."""

    offset: int
    timestamp: int
    timestamp_type: int
    checksum: Unreadable
    key: None = None
    value: None = None
    headers: tuple[()] = ()


class _CheckedBatch:
    """A batch whose records are all read (decompressed, parsed) before the first is
    given out; one that fails gives a single stand-in instead."""

    def __init__(self, batch: Any, owner: "ReadableRecords") -> None:
        self._batch = batch
        self._owner = owner
        self._crc_ok = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __next__(self) -> Any:  # control batches: aiokafka reads their marker with next()
        return next(self._batch)

    def validate_crc(self) -> bool:
        # a mismatch is answered by a stand-in below, not by an exception
        self._crc_ok = bool(self._batch.validate_crc())
        return True

    def __iter__(self) -> Iterator[Any]:
        try:
            if not self._crc_ok:
                raise aiokafka_errors.CorruptRecordException("the batch's CRC does not match")
            records = list(self._batch)
        except Exception as exc:
            yield self._owner.stand_in(self._batch, exc)
            return
        yield from records


class _CheckedRecords:
    def __init__(self, records: Any, owner: "ReadableRecords") -> None:
        self._records = records
        self._owner = owner

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        return None if batch is None else _CheckedBatch(batch, self._owner)


class ReadableRecords(aiokafka_fetcher.PartitionRecords):  # type: ignore[misc]
    """aiokafka's records of one fetched partition; for the topics in `guarded`, a batch
    that cannot be read gives a stand-in record instead of raising."""

    guarded: ClassVar[set[str]] = set()

    def __init__(self, tp: Any, records: Any, *args: Any, **kwargs: Any) -> None:
        if tp.topic in self.guarded:
            records = _CheckedRecords(records, self)
        super().__init__(tp, records, *args, **kwargs)

    def stand_in(self, batch: Any, exc: Exception) -> _StandIn:
        first = max(getattr(batch, "base_offset", -1), self.next_fetch_offset)
        last = max(first, batch.next_offset - 1)
        reason = (
            f"record batch at offsets {first}..{last} could not be read "
            f"(compression codec {getattr(batch, 'compression_type', '?')}): {exc!r}"
        )
        log.error("%s: %s", self._tp, reason)
        timestamp = getattr(batch, "first_timestamp", None)
        return _StandIn(
            offset=first,
            timestamp=-1 if timestamp is None else timestamp,
            timestamp_type=getattr(batch, "timestamp_type", 0) or 0,
            checksum=Unreadable(first, last, reason),
        )


def guard_reads(topics: set[str]) -> None:
    """Unreadable batches of these topics become stand-ins (for this process: aiokafka
    builds its records objects by module name)."""
    ReadableRecords.guarded = topics
    aiokafka_fetcher.PartitionRecords = ReadableRecords


class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    async def seek_to_committed(self) -> Mapping[TP, int]:
        committed: dict[Any, int] = await self.call_thread(
            self._seek_to_committed, self._ensure_consumer()
        )
        floors = self.consumer.floors  # type: ignore[attr-defined]
        for tp, offset in committed.items():
            floors[TP(tp.topic, tp.partition)] = offset
        return committed

    @staticmethod
    async def _seek_to_committed(consumer: Any) -> dict[Any, int]:
        """On the consumer's thread: every partition to its committed offset, or to its
        beginning if it never committed one."""
        committed: dict[Any, int | None] = dict(await consumer.seek_to_committed())
        starts = {tp: offset for tp, offset in committed.items() if offset}
        never = [tp for tp in committed if tp not in starts]
        if never:
            beginnings = await consumer.beginning_offsets(never)
            for tp in never:
                consumer.seek(tp, beginnings[tp])
                starts[tp] = beginnings[tp]
        return starts

    async def _fetch_records(self, *args: Any, **kwargs: Any) -> Any:
        """A fetch that cannot be read is logged and tried again, not a crash."""
        try:
            return await super()._fetch_records(*args, **kwargs)
        except READ_ERRORS as exc:
            log.error("fetched records could not be read (fetching again): %r", exc)
            await asyncio.sleep(READ_RETRY_S)
            return {}


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
        guard_reads(self.agent_owned)
        # seeks the agent's partitions back to what it vouches for, after a failed fetch
        self.refetch: Callable[[], Awaitable[None]] | None = None
        self.failed_fetch: tuple[float, str] | None = None  # (monotonic time, reason)

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _seek(self, partition: TP, offset: int) -> None:
        await self._thread.call_thread(self._seek_now, partition, offset)

    async def _seek_now(self, partition: TP, offset: int) -> None:
        """On the consumer's thread: a partition no longer assigned (a rebalance came
        between the ask and now) is left alone; its next owner starts it."""
        if partition in self._thread.assignment():
            self._thread.seek(partition, offset)

    async def _drain_messages(self, fetcher: Any) -> None:
        """Faust's fetch loop, started again after a failure that is not a stop (every
        failure is logged, and the latest shows on /readyz for `FAILED_FETCH_SHOWN_S`)."""
        refetching = False
        while True:
            try:
                if refetching and self.refetch is not None:
                    await self.refetch()
                return await self._fetch_and_deliver(fetcher)
            except self.consumer_stopped_errors:
                if self.transport.app.should_stop:
                    log.info("the broker stopped the consumer while the worker stops")
                    return
                raise
            except asyncio.CancelledError:
                if self.transport.app.should_stop:
                    return
                raise
            except Exception as exc:
                if fetcher.should_stop or self.should_stop:
                    raise
                self.failed_fetch = (time.monotonic(), repr(exc))
                log.error(
                    "fetching failed (%r); fetching again in %.0f s from the answered offsets",
                    exc,
                    READ_RETRY_S,
                )
            await asyncio.sleep(READ_RETRY_S)
            refetching = True

    async def _fetch_and_deliver(self, fetcher: Any) -> None:
        """Faust's fetch loop (`Consumer._drain_messages`: records past each partition's
        read offset to the conductor, gaps noted for acknowledged topics, Faust's commit
        every `broker_commit_every` acknowledgements), each record delivered inline."""
        callback, read_offset = self.callback, self._read_offset
        acks_enabled_for = self.app.topics.acks_enabled_for
        consumer_stopped, fetcher_stopped = self._stopped.is_set, fetcher._stopped.is_set
        since_yield = 0
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                self.diag.set_flag(CONSUMER_FETCHING)
                records = self.getmany(timeout=1.0)
                await asyncio.sleep(0)  # getmany may return at once, again and again
                if self.should_stop:
                    continue
                async for tp, message in records:
                    since_yield += 1
                    if since_yield > DELIVER_YIELD_EVERY:
                        await asyncio.sleep(0)
                        since_yield = 0
                    offset, last = message.offset, read_offset[tp]
                    if last is not None and offset < last:
                        continue  # read already (Faust drops it too)
                    if last and offset - last > 1 and acks_enabled_for(message.topic):
                        await self._add_gap(tp, last + 1, offset)
                    commit_every = self._commit_every
                    if commit_every is not None and self._n_acked >= commit_every:
                        self._n_acked = 0
                        await self.commit()
                    await self._deliver(callback, message)
                    read_offset[tp] = offset
                self.diag.unset_flag(CONSUMER_FETCHING)
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)

    async def _deliver(self, callback: Callable[[Any], Any], message: Any) -> None:
        """The conductor's callback, run here up to its first wait; when it waits, it is
        finished as Faust runs it: given up if the flow is suspended (a rebalance: the
        record is dropped, and the agent reads it again from its positions)."""
        coro = callback(message)
        waiting = start_inline(coro)
        if waiting is not None:
            await self.wait_first(finish(coro, waiting), self.suspend_flow.wait())

    def fetch_trouble(self) -> str | None:
        """What /readyz says while fetching fails: the latest failure, if recent."""
        if self.failed_fetch is None:
            return None
        at, reason = self.failed_fetch
        ago = time.monotonic() - at
        if ago >= FAILED_FETCH_SHOWN_S:
            return None
        return f"fetching failed {ago:.0f} s ago ({reason}); fetching again"

    async def commit_positions(self, offsets: Mapping[TP, int]) -> bool:
        """Commit these offsets (those of partitions no longer assigned are left out)."""
        return bool(await self._thread.commit(offsets))


class Transport(faust_aiokafka.Transport):
    Consumer = Consumer
