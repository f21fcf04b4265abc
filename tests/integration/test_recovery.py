"""Recovery and audit by replaying offsets: replay, get --at, verify."""

import json
import shutil
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from processor.kafka.topics import TopicNames
from schemas.messages import RunSnapshot, Transition
from tests.integration.harness import (
    Env,
    WorkerProcess,
    assert_serves_changelog,
    make_env,
    published,
    runstate,
    send,
    wait_for_outcomes,
    workload,
)


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def _run_workload(env: Env, runs: int = 300, proposals: int = 3_000) -> None:
    worker = WorkerProcess(env, env.tmp / "w1")
    try:
        worker.wait_ready(partitions=3)
        plan = workload(runs=runs, proposals=proposals, seed=23)
        send(env, plan)
        wait_for_outcomes(env, plan)
    finally:
        assert worker.terminate() == 0, worker.log()


def _answers(env: Env) -> dict[bytes, bytes]:
    """The changelog's answer records of live runs (key -> the rejection), the latest per key."""
    from processor.kafka.config import KafkaSettings
    from processor.kafka.readback import read_partitions
    from processor.records.changelog_keys import ANSWER_CHANGELOG_PREFIX

    found: dict[bytes, bytes] = {}
    for records in read_partitions(KafkaSettings(env.bootstrap), env.topics.changelog).values():
        for r in records:
            if r.key is not None and r.key.startswith(ANSWER_CHANGELOG_PREFIX) and r.value:
                found[r.key] = r.value
    return found


def _delete_topic(admin: AdminClient, topic: str) -> None:
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result()
    for _ in range(100):
        if topic not in admin.list_topics(timeout=10).topics:
            return
        time.sleep(0.2)
    raise AssertionError(f"{topic} still exists")


def test_replay_rebuilds_identical_snapshots_without_state_or_changelog(
    env: Env, admin: AdminClient
) -> None:
    _run_workload(env)
    before = published(env).snapshots
    assert len(before) == 300
    answers = _answers(env)
    assert answers  # the workload's mistakes: refusals the runs remember
    shutil.rmtree(env.tmp / "w1")
    _delete_topic(admin, env.topics.changelog)

    result = runstate(env, "replay", "--state-dir", str(env.tmp / "w1"), "--group-id", env.group_id)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stores rebuilt" in result.stdout
    assert published(env).snapshots == before  # the changelog is back, identical
    assert _answers(env) == answers  # and the runs' answers to refused ids, from the rejections

    worker = WorkerProcess(env, env.tmp / "w1")
    try:
        worker.wait_ready(partitions=3)
        assert_serves_changelog(worker, env, before)
        history = worker.get(worker.run_path(next(iter(before)), "/history"))
        assert [t["revision"] for t in history] == list(range(len(history)))
    finally:
        assert worker.terminate() == 0, worker.log()
    again = runstate(env, "replay", "--state-dir", str(env.tmp / "w1"), "--group-id", env.group_id)
    assert again.returncode == 1 and "--force" in again.stderr


def test_get_at_time_and_offset(env: Env) -> None:
    worker = WorkerProcess(env, env.tmp / "w1")
    try:
        worker.wait_ready(partitions=3)
        client = env.client()
        client.create_and_wait("g1", "task_lifecycle")
        started = client.propose_and_wait("g1", "start")
        time.sleep(0.05)
        client.propose_and_wait("g1", "complete")
        client.close()
    finally:
        assert worker.terminate() == 0, worker.log()
    assert isinstance(started, Transition)
    then = runstate(env, "get", "g1", "--at", str(started.at_ms))
    assert then.returncode == 0, then.stderr
    snapshot = RunSnapshot.model_validate_json(then.stdout)
    assert (snapshot.state, snapshot.revision) == ("running", 1)
    records = [t for t in published(env).transitions if t.run_id == "g1"]
    assert [t.to_state for t in records] == ["planned", "running", "done"]
    now = RunSnapshot.model_validate_json(runstate(env, "get", "g1", "--at", "9" * 13).stdout)
    assert now.state == "done"
    before = runstate(env, "get", "g1", "--at", "2000-01-01T00:00:00Z")
    assert before.returncode == 1 and "no run" in before.stderr
    from processor.kafka.config import KafkaSettings
    from processor.kafka.readback import read_partitions

    offsets = [
        r.offset
        for records in read_partitions(
            KafkaSettings(env.bootstrap), env.topics.transitions
        ).values()
        for r in records
        if r.key == b"g1"
    ]
    assert len(offsets) == 3
    for revision, offset in enumerate(offsets):
        at = runstate(env, "get", "g1", "--at-offset", str(offset))
        assert at.returncode == 0, at.stderr
        assert RunSnapshot.model_validate_json(at.stdout).revision == revision


def test_verify_passes_then_names_the_offset_of_an_altered_record(env: Env) -> None:
    _run_workload(env, runs=100, proposals=1_000)
    clean = runstate(env, "verify", "--keyring-file", str(env.keyring_path))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "every chain is intact" in clean.stdout

    # someone with write access appends an altered copy of a committed transition
    original = next(t for t in published(env).transitions if t.event == "start")
    altered = original.model_copy(update={"to_state": "done"})
    producer = Producer({"bootstrap.servers": env.bootstrap})
    offsets: list[int] = []
    partition = [-1]

    def delivered(err: KafkaException | None, msg: object) -> None:
        offsets.append(msg.offset())  # type: ignore[attr-defined]
        partition[0] = msg.partition()  # type: ignore[attr-defined]

    producer.produce(
        env.topics.transitions,
        key=original.run_id.encode(),
        value=json.dumps(json.loads(altered.model_dump_json())).encode(),
        on_delivery=delivered,
    )
    producer.flush(30)
    tampered = runstate(env, "verify", "--keyring-file", str(env.keyring_path))
    assert tampered.returncode == 1
    assert f"transitions partition {partition[0]}, offset {offsets[0]}" in tampered.stdout
    assert "hash does not match" in tampered.stdout
