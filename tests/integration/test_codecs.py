"""Every record a producer may send: proposals compressed with each codec
Kafka has are decided by both runtimes, and the worker stays up.

One worker per runtime takes five rounds in sequence, one per `compression.type`
(none, gzip, snappy, lz4, zstd), each round its own runs and proposal ids sent by a
confluent-kafka producer with that codec. Every proposal gets its outcome (each create
is committed), the runtime's stated guarantee holds, and the worker never exits or
logs a traceback. At the end the proposals topic is read as aiokafka reads it, to
prove the batches were really stored with each codec (librdkafka sends a batch
uncompressed when compressing would not make it smaller).

And a record the Faust runtime cannot read: a Faust worker started with the codec
library hidden (aiokafka then cannot decompress lz4) sends each lz4 batch to the DLQ
with the reason and its offsets, stays up, and decides the uncompressed proposals
sent after it. (librdkafka has every codec built in: the native worker has no such
case, and the broker refuses batches it cannot validate.)"""

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from processor.kafka.config import KafkaSettings
from processor.kafka.readback import read_topics
from processor.kafka.topics import TopicNames
from schemas.messages import DeadLetter
from tests.integration.harness import (
    Env,
    Published,
    WorkerProcess,
    assert_guarantee,
    make_env,
    signed_records,
    wait_for_outcomes,
    workload,
)

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
# Kafka's codec ids in a record batch's attributes (KIP-110 numbering).
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
ROUND_TIMEOUT_S = 30.0
PARTITIONS = 3  # the topic_names fixture's


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


@pytest.fixture(params=["native", "faust"])
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def produce(env: Env, plan: list[dict[str, Any]], codec: str) -> None:
    """The plan's signed proposals from one producer with `compression.type=codec`,
    lingering so that each partition's records go in a few batches of several."""
    producer = Producer(
        {
            "bootstrap.servers": env.bootstrap,
            "compression.type": codec,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",  # the runs' partitions (else wrong_partition)
            "linger.ms": 50,
            "log_level": 4,
        }
    )
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    for key, value, headers in signed_records(env, plan):
        producer.produce(
            env.topics.proposals, key=key, value=value, headers=headers, on_delivery=on_delivery
        )
    assert producer.flush(30) == 0, f"{codec}: records not delivered within 30 s"
    assert not failed, f"{codec}: {failed[:3]}"


def assert_alive(worker: WorkerProcess, label: str, *signs: str) -> None:
    assert worker.proc.poll() is None, (
        f"[{label}] the worker exited ({worker.proc.returncode}):\n{worker.log()}"
    )
    assert worker.health() is not None, f"[{label}] the worker stopped answering:\n{worker.log()}"
    text = worker.log_path.read_text(errors="replace")
    for sign in ("Traceback", "internal error while", *signs):
        assert sign not in text, f"[{label}] worker log shows {sign!r}:\n{worker.log()}"


def assert_round(plan: list[dict[str, Any]], result: Published, label: str) -> None:
    """Every proposal of the round has an outcome, and every create was committed."""
    counts = result.outcome_counts()
    missing = [p["proposal_id"] for p in plan if counts[p["proposal_id"]] == 0]
    assert not missing, f"[{label}] {len(missing)} proposals without an outcome: {missing[:5]}"
    committed = {t.proposal_id for t in result.transitions}
    creates = [p["proposal_id"] for p in plan if p["event"] == "create"]
    assert creates and all(pid in committed for pid in creates), (
        f"[{label}] creates not committed: {sorted(set(creates) - committed)}"
    )


def stored_codecs(env: Env) -> set[int]:
    """The codec of every record batch of the proposals topic, as aiokafka fetches them
    (the batch headers only: nothing is decompressed)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition  # type: ignore[import-untyped]
    from aiokafka.consumer import fetcher  # type: ignore[import-untyped]

    seen: set[int] = set()
    original = fetcher.MemoryRecords

    def peeking(data: bytes) -> Any:
        peek = original(data)
        while peek.has_next():
            batch = peek.next_batch()
            if batch is not None:
                seen.add(batch.compression_type)
        return original(data)

    async def read() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=env.bootstrap, enable_auto_commit=False, group_id=None
        )
        await consumer.start()
        try:
            partitions = [TopicPartition(env.topics.proposals, p) for p in range(PARTITIONS)]
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            ends = await consumer.end_offsets(partitions)
            for tp in partitions:
                while await consumer.position(tp) < ends[tp]:
                    await consumer.getmany(tp, timeout_ms=500)
        finally:
            await consumer.stop()

    fetcher.MemoryRecords = peeking
    try:
        asyncio.run(asyncio.wait_for(read(), 30))
    finally:
        fetcher.MemoryRecords = original
    return seen


def test_proposals_compressed_with_every_codec_are_decided(env: Env, runtime: str) -> None:
    worker = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    plans: list[dict[str, Any]] = []
    try:
        worker.wait_ready(partitions=3)
        for n, codec in enumerate(CODECS):
            label = f"{runtime}/{codec}"
            # runs and proposal ids of their own: run-<seed>-*, p-<seed>-*
            plan = workload(runs=6, proposals=36, seed=1400 + n)
            produce(env, plan, codec)
            result = wait_for_outcomes(env, plan, timeout=ROUND_TIMEOUT_S)
            assert_alive(worker, label, "UnsupportedCodec", "could not be read")
            assert_round(plan, result, label)
            plans += plan
        result = wait_for_outcomes(env, plans, timeout=ROUND_TIMEOUT_S)
        assert_guarantee(env, plans, result, runtime)
        assert_alive(worker, runtime, "UnsupportedCodec", "could not be read")
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()
    assert stored_codecs(env) == set(CODEC_IDS.values()), "a codec's batches were not compressed"


def test_faust_dead_letters_a_batch_it_cannot_read_and_goes_on(
    env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hidden = tmp_path / "hidden" / "cramjam"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("hidden by test_codecs")\n')
    path = [str(hidden.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    worker = WorkerProcess(env, env.tmp / "w1", runtime="faust")
    try:
        worker.wait_ready(partitions=3)
        unreadable = workload(runs=3, proposals=12, seed=1450)
        produce(env, unreadable, "lz4")
        readable = workload(runs=3, proposals=12, seed=1451)
        produce(env, readable, "none")
        result = wait_for_outcomes(env, readable, timeout=ROUND_TIMEOUT_S)
        assert_alive(worker, "faust without cramjam")
        assert_round(readable, result, "faust without cramjam")
        counts = result.outcome_counts()
        assert not any(counts[p["proposal_id"]] for p in unreadable), "an lz4 record was decided"
        letters = [
            DeadLetter.model_validate_json(m.value())
            for m in read_topics(KafkaSettings(env.bootstrap), [env.topics.dlq])
        ]
        covered: set[tuple[int, int]] = set()
        for letter in letters:
            assert "UnsupportedCodecError" in letter.error and "lz4" in letter.error, letter
            found = re.search(r"offsets (\d+)\.\.(\d+)", letter.error)
            assert found, letter.error
            first, last = int(found[1]), int(found[2])
            assert letter.offset == first
            covered |= {(letter.partition, o) for o in range(first, last + 1)}
        # every lz4 record (the first records of each partition) is covered, once
        assert len(covered) == len(unreadable), letters
        assert len(covered) == sum(
            int(found[2]) - int(found[1]) + 1
            for found in (re.search(r"offsets (\d+)\.\.(\d+)", letter.error) for letter in letters)
            if found
        )
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()
