"""Runs that live long, as a user lives them: heartbeats that are liveness (not commits),
proposal ids remembered for the run's life, and records a foreign partitioner put in
the wrong partition. On the real broker, over both runtimes."""

import time
import uuid
import zlib
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from processor.config import KafkaSettings
from processor.intake import signed_headers
from processor.partitioning import partition_for
from processor.topics import TopicNames, create_topics, plan_topics
from schemas.codes import RejectionCode
from schemas.messages import Heartbeat, Proposal, Rejection, Transition
from tests.integration.harness import Env, WorkerProcess, make_env, published

M = "task_lifecycle"
SLOW = {"heartbeat_timeout_ms": 600_000, "retry_backoff_ms": 600_000}


@pytest.fixture(params=["native", "faust"])
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def test_heartbeats_then_a_resent_retry_gets_its_original_transition(
    env: Env, runtime: str
) -> None:
    """100 heartbeats leave the revision alone, so a compare-and-set proposal made
    between them commits; a `retry` sent again after them is answered with the
    transition the first one committed (retry_count rises once), also after the worker
    was killed and its state directory lost (the proposal ids are restored with it)."""
    worker = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    client = env.client()
    try:
        worker.wait_ready(partitions=3)
        assert isinstance(
            client.create_and_wait("h1", M, max_retries=3, deadlines=SLOW), Transition
        )
        started = client.propose_and_wait("h1", "start")
        assert isinstance(started, Transition)
        assert isinstance(client.propose_and_wait("h1", "transient_error"), Transition)
        retried = client.propose_and_wait("h1", "retry", proposal_id="retry-1")
        assert isinstance(retried, Transition) and retried.retry_count == 1
        revision = retried.revision
        ids = [client.heartbeat("h1") for _ in range(50)]
        client.flush()
        beats = [client.wait(i, timeout=60) for i in ids]
        assert all(isinstance(b, Heartbeat) and b.revision == revision for b in beats), beats
        # compare-and-set between heartbeats: the revision the agent read still holds
        cas = client.propose_and_wait(
            "h1",
            "step_started",
            payload={"step": "s1", "idempotency_key": "s1"},
            expected_revision=revision,
        )
        assert isinstance(cas, Transition) and cas.revision == revision + 1, cas
        ids = [client.heartbeat("h1") for _ in range(50)]
        client.flush()
        later = [client.wait(i, timeout=60) for i in ids]
        assert all(isinstance(b, Heartbeat) and b.revision == revision + 1 for b in later)
        last_beat = max(b.at_ms for b in later)  # type: ignore[union-attr]
        again = client.propose_and_wait("h1", "retry", proposal_id="retry-1")
        assert again == retried  # the original transition, not a second retry
        worker.kill()
        # A new worker with an empty state directory: restored from the topics
        second = WorkerProcess(env, env.tmp / "w2", runtime=runtime)
        try:
            second.wait_ready(partitions=3)
            fresh = env.client()
            try:
                once_more = fresh.propose_and_wait("h1", "retry", proposal_id="retry-1")
                assert once_more == retried
                snapshot = second.snapshot("h1")
                assert snapshot is not None and snapshot.retry_count == 1
                assert snapshot.revision == revision + 1
                assert snapshot.heartbeat_at_ms == last_beat  # liveness restored too
            finally:
                fresh.close()
        finally:
            assert second.terminate() == 0, second.log()
    finally:
        client.close()
        worker.terminate()
    history = [t for t in published(env).transitions if t.run_id == "h1"]
    assert not [t for t in history if t.event == "heartbeat"]
    assert [t.event for t in history].count("retry") == 1


def test_a_record_a_crc32_partitioner_placed_is_refused_never_committed(
    env: Env, runtime: str
) -> None:
    """librdkafka's default partitioner (consistent_random: CRC32) puts many keys in
    another partition than murmur2: those records are refused wrong_partition, naming
    the setting to fix; the same proposals from a murmur2 producer commit."""
    worker = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    crc = Producer(
        KafkaSettings(env.bootstrap).client({"partitioner": "consistent_random", "acks": "all"})
    )
    run_ids = [f"doc-{n}" for n in range(40)]
    misplaced = [r for r in run_ids if zlib.crc32(r.encode()) % 3 != partition_for(r, 3)]
    assert len(misplaced) >= 10
    secret = env.keyring.keys["runtime"].secret
    client = env.client()
    try:
        worker.wait_ready(partitions=3)
        sent = {}
        waiter = client.waiter()
        for run_id in misplaced:
            proposal = Proposal(
                proposal_id=f"crc-{uuid.uuid4().hex}",
                run_id=run_id,
                event="create",
                payload={"machine": M},
            )
            value = proposal.model_dump_json(exclude_none=True).encode()
            crc.produce(
                env.topics.proposals,
                value,
                run_id.encode(),
                headers=signed_headers(value, "runtime", secret),
            )
            sent[run_id] = proposal.proposal_id
        assert crc.flush(30) == 0
        for run_id, proposal_id in sent.items():
            outcome = waiter.wait(proposal_id, 60)
            assert isinstance(outcome, Rejection), outcome
            assert outcome.code is RejectionCode.WRONG_PARTITION
            assert "partitioner=murmur2_random" in outcome.detail
            assert f"lives in partition {partition_for(run_id, 3)}" in outcome.detail
        # the same runs, from the SDK (murmur2): created where they belong
        for run_id in misplaced[:5]:
            assert isinstance(client.create_and_wait(run_id, M), Transition)
        time.sleep(0.5)
    finally:
        client.close()
        assert worker.terminate() == 0, worker.log()
    committed = [t for t in published(env).transitions if t.run_id in set(misplaced)]
    assert sorted(t.run_id for t in committed) == sorted(misplaced[:5])


def _recreate(env: Env, partitions: int) -> None:
    """Delete the test's topics and create them again under the same names."""
    admin = AdminClient(KafkaSettings(env.bootstrap).client())
    plans = plan_topics(env.topics, partitions=partitions, replication=1)
    names = [p.name for p in plans]
    for future in admin.delete_topics(names, operation_timeout=30).values():
        future.result()
    deadline = time.monotonic() + 60
    while set(names) & set(admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, "topics not deleted"
        time.sleep(0.2)
    while True:  # the broker may still be finishing the deletion
        try:
            create_topics(admin, plans)
            return
        except KafkaException:
            assert time.monotonic() < deadline, "topics not created again"
            time.sleep(0.5)


def test_topics_recreated_under_a_kept_state_directory(env: Env, runtime: str) -> None:
    """The compose story: Kafka's data is gone, the worker's state volume is not. The
    worker sees new topic ids, discards its stores and decides nothing against them:
    a run of the old topics does not exist in the new ones. Topics recreated with
    another partition count stop the worker, saying why and what to do."""
    worker = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    client = env.client()
    try:
        worker.wait_ready(partitions=3)
        assert isinstance(client.create_and_wait("old-1", M, deadlines=SLOW), Transition)
        assert isinstance(client.propose_and_wait("old-1", "start"), Transition)
    finally:
        client.close()
        assert worker.terminate() == 0, worker.log()
    _recreate(env, 3)
    again = WorkerProcess(env, env.tmp / "w1", runtime=runtime)  # the same state directory
    client = env.client()
    try:
        again.wait_ready(partitions=3)
        assert again.snapshot("old-1") is None  # not decided against the old state
        start = client.propose_and_wait("old-1", "start")
        assert isinstance(start, Rejection) and start.code is RejectionCode.UNKNOWN_RUN
        created = client.create_and_wait("old-1", M, deadlines=SLOW)
        assert isinstance(created, Transition) and created.revision == 0
    finally:
        client.close()
        assert again.terminate() == 0, again.log()
    assert "discarding the stores" in again.log()
    _recreate(env, 6)
    grown = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    assert grown.wait(90) != 0, grown.log()
    assert "has 6 partitions, but the state" in grown.log()
    assert "murmur2" in grown.log()
