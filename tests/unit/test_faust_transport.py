"""The Faust runtime's consumer: seeks on the consumer's own thread, a fetch that fails
other than by a stop starts again from the agent's positions, and the fetch loop's
deliveries (no broker)."""

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from processor.runtimes.faust.transport import FAILED_FETCH_SHOWN_S, Consumer

PARTITION = TP("t.proposals", 0)


class ThreadOfItsOwn:
    """Stands for Faust's consumer thread: `call_thread` runs a coroutine function on an
    event loop in another thread, as mode's method queue does; `seek` records the thread
    it ran on (aiokafka's seek is what must run there)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.seeks: list[tuple[TP, int, int]] = []
        self.assigned = {PARTITION}

    async def call_thread(self, fun: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        done = asyncio.run_coroutine_threadsafe(fun(*args), self.loop)
        return await asyncio.wrap_future(done)

    def seek(self, partition: TP, offset: int) -> None:
        self.seeks.append((partition, offset, threading.get_ident()))

    def assignment(self) -> set[TP]:
        return self.assigned

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def consumer_thread() -> Iterator[ThreadOfItsOwn]:
    thread = ThreadOfItsOwn()
    yield thread
    thread.close()


def bare_consumer(thread: ThreadOfItsOwn | None = None) -> Consumer:
    """A `Consumer` without Faust's app (only what the methods under test read)."""
    consumer = Consumer.__new__(Consumer)
    consumer._thread = thread  # type: ignore[assignment]
    consumer.refetch = None
    return consumer


def test_every_seek_runs_on_the_consumer_thread(consumer_thread: ThreadOfItsOwn) -> None:
    consumer = bare_consumer(consumer_thread)
    asyncio.run(consumer._seek(PARTITION, 42))
    assert consumer_thread.seeks == [(PARTITION, 42, consumer_thread.thread.ident)]


def test_a_seek_of_a_partition_no_longer_assigned_is_left_alone(
    consumer_thread: ThreadOfItsOwn,
) -> None:
    """A rebalance between the ask and the consumer thread's turn: aiokafka would raise
    for a partition it no longer has; its next owner starts it instead."""
    consumer = bare_consumer(consumer_thread)
    consumer_thread.assigned = set()
    asyncio.run(consumer._seek(PARTITION, 42))
    assert consumer_thread.seeks == []


class Fetcher:
    def __init__(self) -> None:
        self.should_stop = False
        self._stopped = threading.Event()


def draining(
    monkeypatch: pytest.MonkeyPatch,
    failures: list[BaseException],
    refetch_failures: list[BaseException] | None = None,
) -> tuple[Consumer, list[str]]:
    """A consumer whose Faust fetch loop raises each of `failures` in turn, then returns
    (and whose refetch raises each of `refetch_failures` in turn)."""
    calls: list[str] = []
    refetch_failures = refetch_failures or []

    async def fetch_and_deliver(self: Consumer, fetcher: Fetcher) -> None:
        calls.append("drain")
        if failures:
            raise failures.pop(0)

    async def refetch() -> None:
        calls.append("refetch")
        if refetch_failures:
            raise refetch_failures.pop(0)

    monkeypatch.setattr(Consumer, "_fetch_and_deliver", fetch_and_deliver)
    monkeypatch.setattr("processor.runtimes.faust.transport.READ_RETRY_S", 0.0)
    consumer = bare_consumer()
    consumer.transport = SimpleNamespace(app=SimpleNamespace(should_stop=False))  # type: ignore[assignment]
    consumer.refetch = refetch
    consumer.failed_fetch = None
    monkeypatch.setattr(Consumer, "should_stop", False, raising=False)
    return consumer, calls


def test_a_failed_fetch_fetches_again_from_the_answered_offsets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer, calls = draining(
        monkeypatch, [KeyError(PARTITION), RuntimeError("gone")], [RuntimeError("moved")]
    )
    assert consumer.fetch_trouble() is None
    asyncio.run(consumer._drain_messages(Fetcher()))
    # the refetch that failed is tried again, then the fetch loop
    assert calls == ["drain", "refetch", "refetch", "drain", "refetch", "drain"]
    trouble = consumer.fetch_trouble()
    assert trouble is not None and "RuntimeError('gone')" in trouble  # the latest
    assert consumer.failed_fetch is not None
    consumer.failed_fetch = (consumer.failed_fetch[0] - FAILED_FETCH_SHOWN_S, "old")
    assert consumer.fetch_trouble() is None


def test_a_stop_is_not_fetched_through(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = Consumer.consumer_stopped_errors[0]()
    consumer, calls = draining(monkeypatch, [stopped])
    with pytest.raises(type(stopped)):
        asyncio.run(consumer._drain_messages(Fetcher()))
    assert calls == ["drain"]

    consumer, calls = draining(monkeypatch, [stopped])
    consumer.transport.app.should_stop = True  # the worker stops: the loop just ends
    asyncio.run(consumer._drain_messages(Fetcher()))
    assert calls == ["drain"]

    consumer, calls = draining(monkeypatch, [KeyError(PARTITION)])
    fetcher = Fetcher()
    fetcher.should_stop = True
    with pytest.raises(KeyError):
        asyncio.run(consumer._drain_messages(fetcher))
    assert calls == ["drain"]


class Delivering:
    """What the fetch loop reads of Faust's consumer, around one fetch of `records`."""

    def __init__(self, records: list[tuple[TP, int]], waits: set[int]) -> None:
        self.records, self.waits = records, waits
        self.delivered: list[int] = []
        self.given_up: list[int] = []
        self.release = asyncio.Event()
        self.waiting = asyncio.Event()

    async def callback(self, message: Any) -> None:
        if message.offset in self.waits:  # a full queue: waits for room
            self.waiting.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.given_up.append(message.offset)
                raise
        self.delivered.append(message.offset)

    def consumer(self) -> Consumer:
        consumer = bare_consumer()
        fetched = [self.records]

        async def getmany(timeout: float) -> AsyncIterator[tuple[TP, Any]]:
            for tp, offset in fetched.pop(0) if fetched else []:
                yield tp, SimpleNamespace(offset=offset, topic=tp.topic)
            consumer._stopped.set()  # one fetch, then the consumer stops

        consumer.callback = self.callback  # type: ignore[assignment,method-assign]
        consumer.getmany = getmany  # type: ignore[assignment,method-assign]
        consumer._read_offset = {PARTITION: None}  # type: ignore[assignment]
        consumer.app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda t: False))  # type: ignore[assignment]
        consumer.diag = SimpleNamespace(set_flag=lambda f: None, unset_flag=lambda f: None)  # type: ignore[assignment]
        consumer._commit_every = None
        consumer.suspend_flow = asyncio.Event()  # type: ignore[assignment]
        consumer._stopped, consumer._crashed = asyncio.Event(), asyncio.Event()  # type: ignore[assignment]
        consumer.loop = asyncio.get_running_loop()  # type: ignore[misc]
        return consumer


def test_the_fetch_loop_delivers_in_order_and_waits_for_a_delivery_that_waits() -> None:
    async def main() -> tuple[list[int], dict[TP, int | None]]:
        delivering = Delivering([(PARTITION, o) for o in (5, 6, 7)], waits={6})
        consumer = delivering.consumer()
        loop = asyncio.create_task(consumer._fetch_and_deliver(Fetcher()))
        await asyncio.wait_for(delivering.waiting.wait(), 5)
        assert delivering.delivered == [5]  # 6 waits, and 7 after it
        delivering.release.set()
        await asyncio.wait_for(loop, 5)
        return delivering.delivered, dict(consumer._read_offset)

    assert asyncio.run(main()) == ([5, 6, 7], {PARTITION: 7})


def test_a_delivery_that_waits_is_given_up_when_the_flow_is_suspended() -> None:
    """A rebalance suspends the flow: a delivery waiting for room is given up (the
    record is dropped and read again from the agent's positions), as in Faust's loop,
    and the ones after it are delivered."""

    async def main() -> tuple[list[int], list[int]]:
        delivering = Delivering([(PARTITION, o) for o in (5, 6, 7)], waits={6})
        consumer = delivering.consumer()
        loop = asyncio.create_task(consumer._fetch_and_deliver(Fetcher()))
        await asyncio.wait_for(delivering.waiting.wait(), 5)
        consumer.suspend_flow.set()
        await asyncio.wait_for(loop, 5)
        return delivering.delivered, delivering.given_up

    assert asyncio.run(main()) == ([5, 7], [6])


def test_records_below_the_read_offset_are_not_delivered() -> None:
    async def main() -> list[int]:
        delivering = Delivering([(PARTITION, o) for o in (3, 4, 5)], waits=set())
        consumer = delivering.consumer()
        consumer._read_offset[PARTITION] = 4
        await asyncio.wait_for(consumer._fetch_and_deliver(Fetcher()), 5)
        return delivering.delivered

    assert asyncio.run(main()) == [4, 5]
