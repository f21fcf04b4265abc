"""The Faust agent's batches (no broker, no Faust app): deciding a batch delivers and
stores what deciding its records one at a time does. Each record of a batch is decided
against the table and what the batch's earlier outcomes will write to it (a run moved
twice in one batch, a proposal sent again within its batch), and every record of an
outcome but its snapshot is delivered before any snapshot of the batch."""

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.workload import Keys, for_topic, lives
from processor.kafka.config import KafkaSettings
from processor.kafka.partitioning import partition_for
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines
from processor.records.limits import UNLIMITED
from processor.records.punctuator import Punctuator, timer_key
from processor.records.stats import OutcomeStats
from processor.runtimes.faust.observe import StateIndex, faust_metrics
from processor.runtimes.faust.processing import Decision
from processor.runtimes.faust.table import SOURCE_OFFSET_HEADER
from processor.runtimes.faust.timers import DueIndex
from processor.runtimes.settings import WorkerConfig, WorkerSettings
from processor.serving.read_fence import ReadFence
from processor.trust.keyring import KeyringWatch
from processor.trust.signatures import Algorithm
from tests.examples import examples

PARTITIONS = 3
TOPICS = TopicNames.with_prefix("t.")
KEYS = Keys.generate(Algorithm.HMAC_SHA256)


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
    """The runs table as the agent uses it, over a dict per partition."""

    def __init__(self) -> None:
        self.partitions: dict[int, dict[bytes, bytes]] = {}

    def partition_read(self, partition: int, key: bytes) -> bytes | None:
        return self.partitions.get(partition, {}).get(key)

    partition_get = partition_read

    def partition_put(self, partition: int, key: bytes, value: bytes) -> None:
        self.partitions.setdefault(partition, {})[key] = value

    def partition_delete(self, partition: int, key: bytes) -> None:
        self.partitions.get(partition, {}).pop(key, None)

    def partition_keys(self, partition: int, prefix: bytes) -> list[bytes]:
        return sorted(k for k in self.partitions.get(partition, {}) if k.startswith(prefix))


@dataclass
class Topic:
    """An output topic whose sends are acknowledged once the test lets them."""

    name: str
    sent: list[tuple[str, int, bytes | None, bytes | None, Any]]
    acks: list["asyncio.Future[None]"] = field(default_factory=list)

    async def send(
        self, *, key: bytes | None, value: bytes | None, partition: int, headers: Any
    ) -> "asyncio.Future[None]":
        self.sent.append((self.name, partition, key, value, headers))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def decision(table: Table, sent: list[Any], marks: dict[int, int]) -> Decision:
    config = WorkerConfig(
        kafka=KafkaSettings("127.0.0.1:1"),
        topics=TOPICS,
        keyring=KEYS.keyring,
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
        outputs={name: Topic(name, sent) for name in vars(TOPICS).values()},  # type: ignore[misc]
        punctuator=Punctuator(TOPICS, timer_key(KEYS.keyring, None, None), KEYS.keyring),
        keyring=KeyringWatch(KEYS.keyring, None),
        metrics=faust_metrics(config.machines, states, lambda: [], lambda: {}),
        stats=OutcomeStats(),
        due_index=DueIndex(),
        run_states=states,
        read_fence=ReadFence(),
        delivered=delivered,
    )
    return made


def messages(seed: int, runs: int, proposals: int, resent: float) -> list[Message]:
    """Lives of the built-in machines, with some records sent again later (an agent's
    retry), each at the next offset of its run's partition."""
    rng = random.Random(seed)
    records = for_topic(lives(KEYS, runs, proposals, seed), KEYS, TOPICS.proposals)
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


def run(batches: list[list[Message]]) -> tuple[Table, list[Any], dict[int, int]]:
    table, sent, marks = Table(), list[Any](), dict[int, int]()
    deciding = decision(table, sent, marks)

    async def decide_all() -> None:
        for batch in batches:
            await deciding.decide(batch)

    asyncio.run(decide_all())
    return table, sent, marks


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
)
def test_a_batch_delivers_and_stores_what_one_at_a_time_does(
    seed: int, cuts: list[int], resent: float
) -> None:
    stream = messages(seed, runs=6, proposals=60, resent=resent)
    one_by_one = run([[m] for m in stream])
    batches, rest = [], list(stream)
    for cut in cuts * (1 + len(stream) // max(1, sum(cuts))):
        if not rest:
            break
        batches.append(rest[:cut])
        rest = rest[cut:]
    batches += [rest] if rest else []
    batched = run(batches)
    transitions = [r for r in batched[1] if r[0] == TOPICS.transitions]
    assert len(transitions) > len(stream) / 3  # decided, not dead-lettered
    # Outputs: the same records, in the same order in every partition of every topic.
    assert by_partition(batched[1], False) == by_partition(one_by_one[1], False)
    # The changelog: each partition's snapshots (the records naming their proposal's
    # offset) in the same order, and every record the same; the table and marks equal.
    snapshots = [
        {k: [r for r in v if r[2] and r[2][0][0] == SOURCE_OFFSET_HEADER] for k, v in d.items()}
        for d in (by_partition(batched[1], True), by_partition(one_by_one[1], True))
    ]
    assert snapshots[0] == snapshots[1]
    assert sorted(map(repr, batched[1])) == sorted(map(repr, one_by_one[1]))
    assert batched[0].partitions == one_by_one[0].partitions
    assert batched[2] == one_by_one[2]


def test_every_snapshot_of_a_batch_goes_after_its_other_records() -> None:
    stream = messages(7, runs=5, proposals=50, resent=0.2)
    table, sent, _ = run([stream])
    phases = [bool(headers and headers[0][0] == SOURCE_OFFSET_HEADER) for *_, headers in sent]
    first = phases.index(True)
    assert not any(phases[:0]) and all(phases[first:])
    assert sum(phases) > 0 and table.partitions
