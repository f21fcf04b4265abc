"""The Faust agent's batches (no broker, no Faust app): deciding a batch delivers and
stores what deciding its records one at a time does. Each record of a batch is decided
against the table and what the batch's earlier outcomes will write to it (a run moved
twice in one batch, a proposal sent again within its batch), and every record of an
outcome but its snapshot is delivered before any snapshot of the batch. Under an
Ed25519 keyring, a batch's signatures are verified on threads beforehand, some of them
forged, and the decisions are still those made one record at a time."""

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from benchmarks.workload import Keys, for_topic, lives
from processor.kafka.config import KafkaSettings
from processor.kafka.partitioning import partition_for
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines
from processor.records.changelog_keys import (
    INDEX_HEADER,
    REVISION_HEADER,
    revision_header,
    snapshot_index,
)
from processor.records.limits import UNLIMITED
from processor.records.punctuator import Punctuator
from processor.records.stats import OutcomeStats
from processor.runtimes.faust.observe import StateIndex, faust_metrics
from processor.runtimes.faust.processing import Decision
from processor.runtimes.faust.producer import Deliver, Sendable
from processor.runtimes.faust.table import (
    NEXT_OFFSET_KEY,
    SOURCE_OFFSET_HEADER,
    NotHeld,
    RunsTable,
    TableWrites,
)
from processor.runtimes.faust.timers import DueIndex
from processor.runtimes.settings import WorkerConfig, WorkerSettings
from processor.serving.read_fence import ReadFence
from processor.trust.keygen import PROCESSOR_KEY_ID
from processor.trust.keyring import KeyringWatch
from processor.trust.signatures import HEADER_SIGNATURE, Algorithm
from schemas.messages import RunSnapshot, Transition
from tests.examples import examples

PARTITIONS = 3
TOPICS = TopicNames.with_prefix("t.")
KEYS = {algorithm: Keys.generate(algorithm) for algorithm in Algorithm}
HMAC = KEYS[Algorithm.HMAC_SHA256]


@dataclass
class Message:
    """What the agent reads of a Faust event's message."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, Any]]
    partition: int
    offset: int
    timestamp: float
    topic: str = TOPICS.proposals
    timestamp_type: int = 1  # LogAppendTime
    checksum: Any = None
    generation_id: int = 1


class Table:
    """The runs table as the agent uses it, over a dict per partition; the partitions in
    `dropped` are not held (revoked, or the worker stopping: Faust dropped their stores)."""

    def __init__(self) -> None:
        self.partitions: dict[int, dict[bytes, bytes]] = {}
        self.dropped: set[int] = set()

    def holds(self, partition: int) -> bool:
        return partition not in self.dropped

    def partition_read(self, partition: int, key: bytes) -> bytes | None:
        if not self.holds(partition):
            raise NotHeld(partition)
        return self.partitions.get(partition, {}).get(key)

    partition_get = partition_read

    def write(self, writes: TableWrites) -> set[int]:
        written = set()
        for partition, pairs in writes.by_partition.items():
            if not self.holds(partition):
                continue
            written.add(partition)
            stored = self.partitions.setdefault(partition, {})
            for key, value in pairs:
                if value is None:
                    stored.pop(key, None)
                else:
                    stored[key] = value
        return written

    def partition_keys(self, partition: int, prefix: bytes) -> list[bytes]:
        return sorted(k for k in self.partitions.get(partition, {}) if k.startswith(prefix))


def deliverer(sent: list[Any]) -> Deliver:
    """Outputs "delivered" into `sent`, in the order produced, each acknowledged at once."""

    async def deliver(records: Sequence[Sendable]) -> None:
        sent.extend((r.topic, r.partition, r.key, r.value, r.headers) for r in records)

    return deliver


def decision(table: Table, sent: list[Any], marks: dict[int, int], keys: Keys) -> Decision:
    config = WorkerConfig(
        kafka=KafkaSettings("127.0.0.1:1"),
        topics=TOPICS,
        keyring=keys.keyring,
        machines=builtin_machines(),
        settings=WorkerSettings(),
    )
    states = StateIndex()

    def delivered(message: Any, last: int) -> None:
        marks[message.partition] = last + 1

    made = Decision(
        config=config,
        partitions=PARTITIONS,
        limits=UNLIMITED,
        runs=table,  # type: ignore[arg-type]
        deliver=deliverer(sent),
        punctuator=Punctuator(TOPICS, keys.signers[PROCESSOR_KEY_ID], keys.keyring),
        keyring=KeyringWatch(keys.keyring, None),
        metrics=faust_metrics(config.machines, states, lambda: [], lambda: {}),
        stats=OutcomeStats(),
        due_index=DueIndex(),
        run_states=states,
        read_fence=ReadFence(),
        delivered=delivered,
    )
    return made


async def decide_alone(deciding: Decision, batch: Sequence[Any]) -> None:
    """A batch decided and delivered, with no batch travelling before it."""
    prepared = deciding.prepare_batch(batch)
    if prepared is not None:
        await deciding.complete(prepared, None)


def messages(
    seed: int, runs: int, proposals: int, resent: float, keys: Keys = HMAC, forged: float = 0.0
) -> list[Message]:
    """Lives of the built-in machines, with some records sent again later (an agent's
    retry) and some with a signature not theirs (`forged`), each at the next offset of
    its run's partition."""
    rng = random.Random(seed)
    records = [
        replace(record, headers=_forged(record.headers)) if rng.random() < forged else record
        for record in for_topic(lives(keys, runs, proposals, seed), keys, TOPICS.proposals)
    ]
    stream = list(records)
    for record in records:
        if rng.random() < resent:
            stream.insert(rng.randrange(stream.index(record), len(stream) + 1), record)
    now, offsets, out = time.time(), dict[int, int](), []
    for record in stream:
        partition = partition_for((record.key or b"").decode(), PARTITIONS)
        offset = offsets[partition] = offsets.get(partition, -1) + 1
        out.append(Message(record.key, record.value, list(record.headers), partition, offset, now))
    return out


def _forged(headers: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The signature header's last hex digit changed."""
    out = []
    for name, value in headers:
        if name == HEADER_SIGNATURE:
            text = value.decode() if isinstance(value, bytes) else str(value)
            value = text[:-1] + ("0" if text[-1] != "0" else "1")
        out.append((name, value))
    return out


def run(batches: list[list[Message]], keys: Keys = HMAC) -> tuple[Table, list[Any], dict[int, int]]:
    table, sent, marks = Table(), list[Any](), dict[int, int]()
    deciding = decision(table, sent, marks, keys)

    async def decide_all() -> None:
        for batch in batches:
            await decide_alone(deciding, batch)

    try:
        asyncio.run(decide_all())
    finally:
        deciding.verifier.close()
    return table, sent, marks


def cut(stream: list[Message], sizes: list[int]) -> list[list[Message]]:
    """`stream` cut into batches of `sizes`, in turn, as long as it lasts."""
    batches, rest = [], list(stream)
    for size in sizes * (1 + len(stream) // max(1, sum(sizes))):
        if not rest:
            break
        batches.append(rest[:size])
        rest = rest[size:]
    return batches + ([rest] if rest else [])


def names_its_offset(headers: Any) -> bool:
    """A snapshot: the changelog record naming its proposal's offset."""
    return any(name == SOURCE_OFFSET_HEADER for name, _ in headers or ())


def by_partition(sent: list[Any], changelog: bool) -> dict[tuple[str, int], list[Any]]:
    out: dict[tuple[str, int], list[Any]] = {}
    for topic, partition, key, value, headers in sent:
        if (topic == TOPICS.changelog) == changelog:
            out.setdefault((topic, partition), []).append((key, value, headers))
    return out


@settings(max_examples=examples(60), deadline=None)
@given(
    seed=st.integers(0, 10_000),
    cuts=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    resent=st.sampled_from([0.0, 0.1, 0.3]),
    algorithm=st.sampled_from(list(Algorithm)),
    forged=st.sampled_from([0.0, 0.2]),
)
# Batches large enough to be verified on threads beforehand, forgeries among them.
@example(seed=3, cuts=[20], resent=0.1, algorithm=Algorithm.ED25519, forged=0.2)
def test_a_batch_delivers_and_stores_what_one_at_a_time_does(
    seed: int, cuts: list[int], resent: float, algorithm: Algorithm, forged: float
) -> None:
    keys = KEYS[algorithm]
    stream = messages(seed, runs=6, proposals=60, resent=resent, keys=keys, forged=forged)
    one_by_one = run([[m] for m in stream], keys)
    batched = run(cut(stream, cuts), keys)
    transitions = [r for r in batched[1] if r[0] == TOPICS.transitions]
    # Decided, not dead-lettered (a forged create leaves the rest of its run refused).
    assert len(transitions) > (len(stream) / 3 if forged == 0 else 0)
    if forged:
        refused = [r for r in batched[1] if r[0] == TOPICS.rejections]
        assert any(b'"unauthenticated"' in value for _, _, _, value, _ in refused)
    # Outputs: the same records, in the same order in every partition of every topic.
    assert by_partition(batched[1], False) == by_partition(one_by_one[1], False)
    # The changelog: each partition's snapshots (the records naming their proposal's
    # offset) in the same order, and every record the same; the table and marks equal.
    snapshots = [
        {k: [r for r in v if names_its_offset(r[2])] for k, v in d.items()}
        for d in (by_partition(batched[1], True), by_partition(one_by_one[1], True))
    ]
    assert snapshots[0] == snapshots[1]
    assert sorted(map(repr, batched[1])) == sorted(map(repr, one_by_one[1]))
    assert batched[0].partitions == one_by_one[0].partitions
    assert batched[2] == one_by_one[2]
    # Each partition's local mark is the offset after the last proposal answered there.
    for partition, mark in batched[2].items():
        assert batched[0].partitions[partition][NEXT_OFFSET_KEY] == str(mark).encode()


def test_every_snapshot_of_a_batch_goes_after_its_other_records() -> None:
    stream = messages(7, runs=5, proposals=50, resent=0.2)
    table, sent, _ = run([stream])
    phases = [names_its_offset(headers) for *_, headers in sent]
    first = phases.index(True)
    assert not any(phases[:0]) and all(phases[first:])
    assert sum(phases) > 0 and table.partitions


def test_outputs_carry_the_headers_the_native_worker_writes() -> None:
    """Every transition names its revision and proposal id, and every snapshot in the
    changelog its index entry, as the native worker writes them (readers of either
    runtime's topics rely on them)."""
    stream = messages(11, runs=5, proposals=50, resent=0.2)
    _, sent, _ = run([stream])
    transitions = [
        (value, headers) for topic, _, _, value, headers in sent if topic == TOPICS.transitions
    ]
    assert transitions
    for value, headers in transitions:
        t = Transition.model_validate_json(value)
        assert headers == [(REVISION_HEADER, revision_header(t))]
    snapshots = [
        (value, headers)
        for topic, _, key, value, headers in sent
        if topic == TOPICS.changelog
        and names_its_offset(headers)
        and value is not None
        and not key.startswith(b"\x00")
    ]
    assert snapshots
    for value, headers in snapshots:
        snapshot = RunSnapshot.model_validate_json(value)
        assert (INDEX_HEADER, snapshot_index(snapshot)) in headers


def test_a_partition_not_held_is_left_to_its_next_owner() -> None:
    """Records of a partition whose store was dropped (revoked, or the worker stopping)
    are not decided: nothing is sent for them, nothing vouched for. One dropped while its
    batch's outcomes travel is not written or vouched for either (its next owner decides
    those again, from the changelog); the other partitions go on."""
    stream = messages(13, runs=12, proposals=120, resent=0.0)
    assert {m.partition for m in stream} == {0, 1, 2}
    first, second = stream[: len(stream) // 2], stream[len(stream) // 2 :]
    table, sent, marks = Table(), list[Any](), dict[int, int]()
    deciding = decision(table, sent, marks, HMAC)
    deliver = deciding.deliver

    def last(partition: int, records: list[Message]) -> int:
        return max(m.offset for m in records if m.partition == partition)

    async def dropping_partition_1(records: Sequence[Sendable]) -> None:
        table.dropped.add(1)  # revoked while the batch's first phase travels
        await deliver(records)

    async def decide() -> None:
        table.dropped = {0}
        await decide_alone(deciding, first)
        assert {partition for _, partition, *_ in sent} == {1, 2}
        assert marks == {1: last(1, first) + 1, 2: last(2, first) + 1}
        stored = dict(table.partitions[1])
        sent.clear()
        deciding.deliver = dropping_partition_1
        await decide_alone(deciding, second)
        assert {partition for _, partition, *_ in sent} == {1, 2}  # delivered, both
        assert marks == {1: last(1, first) + 1, 2: last(2, second) + 1}
        assert table.partitions[1] == stored

    try:
        asyncio.run(decide())
    finally:
        deciding.verifier.close()
    assert 0 not in table.partitions


def test_the_table_never_opens_a_dropped_store_again() -> None:
    """Reads and writes of the runs table reach only the stores Faust holds open: a
    partition's store dropped (revoked, or the worker stopping) is not opened again, where
    it would be read without the writes skipped since."""

    class Store:
        def __init__(self) -> None:
            self._dbs: dict[int, Any] = {}

        def _db_for_partition(self, partition: int) -> Any:
            raise AssertionError(f"partition {partition}'s store opened again")

    class Db(dict[bytes, bytes]):
        def write(self, batch: Any) -> None:
            self[b"written"] = b"1"

    table = RunsTable.__new__(RunsTable)
    store = Store()
    store._dbs = {1: Db({b"k": b"v"})}
    table._data = store  # type: ignore[assignment]
    assert table.holds(1) and not table.holds(0)
    assert table.partition_read(1, b"k") == b"v"
    with pytest.raises(NotHeld):
        table.partition_read(0, b"k")
    writes = TableWrites()
    writes.put(0, b"a", b"1")
    writes.put(1, b"a", b"1")
    assert table.write(writes) == {1}
    assert 0 not in store._dbs


def test_a_run_is_not_read_from_a_store_not_held() -> None:
    """The HTTP API does not answer "no such run" for a partition it owns but whose store
    is not held (not opened yet, or dropped by a stop): it is not answered from here."""
    from types import SimpleNamespace

    from processor.runtimes.faust.web import FaustNode

    def node(held: bool) -> Any:
        runs = SimpleNamespace(
            holds=lambda partition: held,
            partition_get=lambda partition, key: None,
        )
        return SimpleNamespace(_on_loop=lambda read: read(), _owned_now=lambda: [1], runs=runs)

    assert FaustNode.run(node(held=False), "r", 1, history=False) is None
    found = FaustNode.run(node(held=True), "r", 1, history=False)
    assert found is not None and found.snapshot is None  # owned, held: no such run
