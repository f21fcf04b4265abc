"""The Faust agent's batches travelling while the next is decided (no broker, no Faust
app): whatever order the broker acknowledges deliveries in, batches decided while
earlier ones travel deliver and store what deciding one record at a time does; a batch's
snapshots go only once every record before them is acknowledged and the batch before
is written; and a failed delivery stops every batch after it short of its snapshots."""

import asyncio
import contextvars
import random
from collections.abc import Coroutine, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.workload import Keys
from processor.runtimes.faust.inflight import InFlight
from processor.runtimes.faust.processing import Decision
from processor.runtimes.faust.producer import Sendable
from processor.trust.signatures import Algorithm
from tests.examples import examples
from tests.unit.test_faust_batches import (
    HMAC,
    KEYS,
    TOPICS,
    Message,
    Table,
    by_partition,
    cut,
    decision,
    messages,
    names_its_offset,
    run,
)

DEADLINE_S = 60.0
#: The batch a delivery belongs to: set by the task that completes it.
BATCH: contextvars.ContextVar[int] = contextvars.ContextVar("batch")


class DeliveryFailed(Exception):
    pass


class Broker:
    """Deliveries held until `acknowledge` lets one go, in an order the test picks; each
    delivery's records are produced (`sent`) when it is called. It checks, as each
    batch's snapshots are produced, that every record before them is acknowledged: the
    other records of this batch and of every batch before, and the snapshots before."""

    def __init__(self, sent: list[Any], fail_batch: int | None = None) -> None:
        self.sent = sent
        self.fail_batch = fail_batch
        self.held: list[tuple[asyncio.Future[None], int, int]] = []  # (ack, batch, phase)
        self.calls: dict[int, int] = {}  # batch -> deliveries asked for so far
        self.acknowledged: set[tuple[int, int]] = set()  # (batch, phase)
        self.written: set[int] = set()  # batches whose `complete` returned
        self.snapshot_phases: list[int] = []  # batches, in the order their snapshots went
        self.arrived = asyncio.Event()

    async def deliver(self, records: Sequence[Sendable]) -> None:
        batch = BATCH.get()
        phase = self.calls[batch] = self.calls.get(batch, 0) + 1
        if phase == 2:
            assert all(names_its_offset(r.headers) for r in records)
            assert all((b, 1) in self.acknowledged for b in range(batch + 1))
            assert all(b in self.written for b in range(batch)), "the batch before unwritten"
            self.snapshot_phases.append(batch)
        else:
            assert not any(names_its_offset(r.headers) for r in records)
        self.sent.extend((r.topic, r.partition, r.key, r.value, r.headers) for r in records)
        ack = asyncio.get_running_loop().create_future()
        self.held.append((ack, batch, phase))
        self.arrived.set()
        await ack
        self.acknowledged.add((batch, phase))
        if batch == self.fail_batch and phase == 1:
            raise DeliveryFailed(f"batch {batch}")

    async def acknowledge(self, rng: random.Random, until: asyncio.Task[None]) -> None:
        """Acknowledge held deliveries one at a time, any of them, until `until` ends."""
        while not until.done():
            if not self.held:
                self.arrived.clear()
                waiting = asyncio.ensure_future(self.arrived.wait())
                await asyncio.wait({waiting, until}, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                continue
            ack, _, _ = self.held.pop(rng.randrange(len(self.held)))
            ack.set_result(None)
            # Let what the acknowledgement woke run before the next one.
            await asyncio.wait({until}, timeout=0)


async def tagged(broker: Broker, batch: int, completing: Coroutine[Any, Any, None]) -> None:
    BATCH.set(batch)
    await completing
    broker.written.add(batch)


async def agent(inflight: InFlight, deciding: Decision, broker: Broker, batches: Any) -> None:
    """What the Faust agent does with its batches (app.py `submit`), then drains."""
    for number, batch in enumerate(batches):
        await inflight.room()
        prepared = deciding.prepare_batch(batch)
        assert prepared is not None
        inflight.add(tagged(broker, number, deciding.complete(prepared, inflight.last)))
    await inflight.drain()


def travelling(
    batches: list[list[Message]],
    seed: int,
    depth: int,
    fail_batch: int | None = None,
    keys: Keys = HMAC,
) -> tuple[Table, list[Any], dict[int, int], Broker, BaseException | None]:
    """The agent's run over `batches`, the broker acknowledging in an order drawn from
    `seed`: the table, what was sent, the marks, the broker, and what the agent raised."""
    table, sent, marks = Table(), list[Any](), dict[int, int]()
    deciding = decision(table, sent, marks, keys)
    inflight = InFlight(depth)
    broker = Broker(sent, fail_batch)
    deciding.deliver = broker.deliver
    raised: list[BaseException] = []

    async def main() -> None:
        deciding_task = asyncio.ensure_future(agent(inflight, deciding, broker, batches))
        await broker.acknowledge(random.Random(seed), deciding_task)
        try:
            await deciding_task
        except DeliveryFailed as exc:
            raised.append(exc)
        await inflight.abandon()

    try:
        # Bounded: a batch that never ends (a lost wake-up) fails here, not by hanging.
        asyncio.run(asyncio.wait_for(main(), DEADLINE_S))
    finally:
        deciding.verifier.close()
    return table, sent, marks, broker, raised[0] if raised else None


@settings(max_examples=examples(60), deadline=None)
@given(
    seed=st.integers(0, 10_000),
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=20),
    resent=st.sampled_from([0.0, 0.2]),
    depth=st.integers(1, 3),
)
def test_batches_travelling_together_deliver_and_store_what_one_at_a_time_does(
    seed: int, sizes: list[int], resent: float, depth: int
) -> None:
    stream = messages(seed, runs=6, proposals=60, resent=resent)
    one_by_one = run([[m] for m in stream])
    batches = cut(stream, sizes)
    table, sent, marks, broker, raised = travelling(batches, seed, depth)
    assert raised is None
    assert broker.snapshot_phases == list(range(len(batches)))
    assert by_partition(sent, False) == by_partition(one_by_one[1], False)
    snapshots = [
        {k: [r for r in v if names_its_offset(r[2])] for k, v in d.items()}
        for d in (by_partition(sent, True), by_partition(one_by_one[1], True))
    ]
    assert snapshots[0] == snapshots[1]
    assert sorted(map(repr, sent)) == sorted(map(repr, one_by_one[1]))
    assert table.partitions == one_by_one[0].partitions
    assert marks == one_by_one[2]


@pytest.mark.parametrize("seed", range(8))
def test_a_failed_delivery_stops_every_batch_after_it_short_of_its_snapshots(seed: int) -> None:
    """Its error reaches the agent; no batch from it on sends its snapshots or is
    written or vouched for; what is is exactly what the batches before it decided."""
    stream = messages(seed, runs=6, proposals=60, resent=0.0)
    batches = cut(stream, [7])
    failing = 2
    table, _, marks, broker, raised = travelling(batches, seed, depth=2, fail_batch=failing)
    assert isinstance(raised, DeliveryFailed)
    assert broker.snapshot_phases == list(range(failing))
    assert broker.written == set(range(failing))
    before = run(batches[:failing])
    assert marks == before[2]
    assert table.partitions == before[0].partitions


def test_room_waits_for_the_oldest_and_abandon_cancels_the_rest() -> None:
    async def main() -> None:
        inflight = InFlight(depth=2)
        gates = [asyncio.get_running_loop().create_future() for _ in range(3)]

        async def batch(n: int) -> None:
            await gates[n]

        inflight.add(batch(0))
        await inflight.room()  # one travelling: room for another
        inflight.add(batch(1))
        room = asyncio.ensure_future(inflight.room())
        await asyncio.wait({room}, timeout=0)
        assert not room.done()
        gates[0].set_result(None)
        await room
        assert inflight.busy
        last = inflight.last
        assert last is not None and not last.done()
        await inflight.abandon()
        assert not inflight.busy and last.cancelled()

    asyncio.run(asyncio.wait_for(main(), DEADLINE_S))


@settings(max_examples=examples(10), deadline=None)
@given(seed=st.integers(0, 10_000))
def test_ed25519_batches_travelling_deliver_what_one_at_a_time_does(seed: int) -> None:
    """Signatures verified on threads per batch, some forged, batches travelling."""
    keys = KEYS[Algorithm.ED25519]
    stream = messages(seed, runs=6, proposals=80, resent=0.1, keys=keys, forged=0.2)
    one_by_one = run([[m] for m in stream], keys)
    table, sent, marks, _, raised = travelling(cut(stream, [12, 20]), seed, 2, keys=keys)
    assert raised is None
    assert any(t == TOPICS.rejections for t, *_ in sent)
    assert by_partition(sent, False) == by_partition(one_by_one[1], False)
    assert sorted(map(repr, sent)) == sorted(map(repr, one_by_one[1]))
    assert (table.partitions, marks) == (one_by_one[0].partitions, one_by_one[2])
