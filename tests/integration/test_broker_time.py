"""Only the broker's time decides, per record: the proposals topic switched to CreateTime
under a running worker (either runtime) lets a producer choose its records' timestamps,
and a validly signed proposal stamped an hour ago goes to the DLQ with what to fix,
once, and is never decided."""

import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from processor.kafka.topics import TopicNames
from schemas.messages import Proposal, Transition
from tests.integration.harness import (
    Env,
    WorkerProcess,
    consume_all,
    eventually,
    make_env,
    published,
)

HOUR_MS = 3_600_000


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def _set_timestamp_type(admin: AdminClient, topic: str, kind: str) -> None:
    """Set message.timestamp.type on `topic`, and wait until the broker reports it."""
    entry = ConfigEntry("message.timestamp.type", kind, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while True:
        described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
        config = next(iter(described.values())).result(30)
        if config["message.timestamp.type"].value == kind:
            return
        assert time.monotonic() < deadline, f"{topic} still not {kind} after 30 s"
        time.sleep(0.2)


def _read_back(env: Env, partition: int, offset: int) -> tuple[int, int]:
    """The (timestamp type, timestamp) of the proposals topic's record at `offset`."""
    consumer = Consumer({"bootstrap.servers": env.bootstrap, "group.id": uuid.uuid4().hex})
    try:
        consumer.assign([TopicPartition(env.topics.proposals, partition, offset)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                kind, at_ms = msg.timestamp()
                return kind, at_ms
        raise AssertionError(f"record {partition}@{offset} not read back within 30 s")
    finally:
        consumer.close()


def _produce_create(
    env: Env, producer: Producer, run_id: str, stamped: int
) -> tuple[int, int, tuple[int, int]]:
    """Produce a create for `run_id`, signed at and stamped with `stamped`: (partition,
    offset, the (timestamp type, timestamp) the broker kept)."""
    value = (
        Proposal(
            run_id=run_id,
            proposal_id=f"create-{run_id}",
            event="create",
            payload={"machine": "task_lifecycle"},
        )
        .model_dump_json(exclude_none=True)
        .encode()
    )
    key = run_id.encode()
    headers = env.signing_key("runtime").headers(env.topics.proposals, key, value, stamped)
    delivered: list[tuple[int, int]] = []

    def on_delivery(err: object, msg: object) -> None:
        assert err is None, err
        delivered.append((msg.partition(), msg.offset()))  # type: ignore[attr-defined]

    producer.produce(
        env.topics.proposals,
        key=key,
        value=value,
        headers=headers,
        timestamp=stamped,
        on_delivery=on_delivery,
    )
    assert producer.flush(30) == 0 and delivered
    partition, offset = delivered[0]
    return partition, offset, _read_back(env, partition, offset)


def _first_kept(
    env: Env, producer: Producer, prefix: str, age_ms: int, kind: int
) -> tuple[int, int, str, int]:
    """Produce creates stamped `age_ms` ago, each for a run of its own, until the broker
    keeps one's timestamp type as `kind`: (partition, offset, run id) of that one, and
    how many came before it.

    The broker reports a topic's new message.timestamp.type before its log applies it,
    so the first records after a switch may still be kept the old way. Each of those is
    an ordinary record of the old kind, and the worker treats it as one."""
    deadline = time.monotonic() + 30
    before = 0
    while True:
        stamped = int(time.time() * 1000) - age_ms
        run_id = f"{prefix}-{before}"
        partition, offset, kept = _produce_create(env, producer, run_id, stamped)
        if kept[0] == kind:
            assert kind != TIMESTAMP_CREATE_TIME or kept[1] == stamped, kept
            return partition, offset, run_id, before
        assert time.monotonic() < deadline, f"{prefix}: still not timestamp type {kind} at 30 s"
        before += 1


@pytest.mark.parametrize("runtime", ["native", "faust"])
def test_a_create_time_proposal_is_dead_lettered_not_decided(
    env: Env, admin: AdminClient, runtime: str
) -> None:
    worker = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    client = env.client()
    producer = Producer(
        {"bootstrap.servers": env.bootstrap, "partitioner": "murmur2_random", "log_level": 4}
    )
    try:
        worker.wait_ready(partitions=3)
        # decided as usual while the topic is LogAppendTime
        assert isinstance(client.create_and_wait("bt-before", "task_lifecycle"), Transition)
        _set_timestamp_type(admin, env.topics.proposals, "CreateTime")

        # A create signed an hour ago and stamped then: fresh, if its producer's clock
        # were believed; stale (and refused) by the broker's.
        partition, offset, run_id, _ = _first_kept(
            env, producer, f"bt-stale-{runtime}", HOUR_MS, TIMESTAMP_CREATE_TIME
        )
        dead = consume_all(
            env.bootstrap, env.topics.dlq, 1, **{"isolation.level": "read_committed"}
        )
        assert len(dead) == 1, [m.value() for m in dead]  # exactly once
        letter = json.loads(dead[0].value() or b"{}")
        assert (letter["partition"], letter["offset"]) == (partition, offset)
        for said in ("CreateTime", "message.timestamp.type=LogAppendTime", env.topics.proposals):
            assert said in letter["error"], letter["error"]
        # never decided: no transition, no rejection, no run
        result = published(env)
        assert run_id not in {t.run_id for t in result.transitions}
        assert run_id not in {r.run_id for r in result.rejections}
        assert worker.get(worker.run_path(run_id)) is None

        # and the worker goes on: a record the broker stamps again is decided; one its
        # producer still stamped in the switch's wake is dead-lettered like the first
        _set_timestamp_type(admin, env.topics.proposals, "LogAppendTime")
        _, _, run_id, late = _first_kept(
            env, producer, f"bt-after-{runtime}", 0, TIMESTAMP_LOG_APPEND_TIME
        )
        decided = eventually(
            f"a transition for {run_id}",
            lambda: [t for t in published(env).transitions if t.run_id == run_id] or None,
        )
        assert [t.proposal_id for t in decided] == [f"create-{run_id}"]
        eventually(
            f"{1 + late} dead letters",
            lambda: published(env).dead_letters >= 1 + late or None,
        )
        assert published(env).dead_letters == 1 + late
    finally:
        client.close()
        assert worker.terminate() == 0, worker.log()
