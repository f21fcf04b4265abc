"""Runs that live long, as a user lives them: heartbeats that are liveness (not commits),
proposal ids remembered for the run's life, and records a foreign partitioner put in
the wrong partition. On the real broker, over both runtimes."""

import json
import time
import uuid
import zlib
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from processor.client import Outcome
from processor.kafka.config import KafkaSettings
from processor.kafka.partitioning import partition_for
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames
from schemas.codes import RejectionCode
from schemas.messages import Heartbeat, Proposal, Rejection, Transition
from tests.integration.harness import Env, WorkerProcess, make_env, published, runstate

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
        _heartbeats([client.wait(i, timeout=60) for i in ids], revision)
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
        later = _heartbeats([client.wait(i, timeout=60) for i in ids], revision + 1)
        last_beat = max(b.at_ms for b in later)
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


def _heartbeats(answers: list[Outcome], revision: int) -> list[Heartbeat]:
    """The heartbeats taken of `answers` to heartbeats sent back to back. Each is taken,
    or, signed in the same millisecond as one taken, refused `duplicate` (heartbeats are
    taken in signing order, never twice); none moves the revision."""
    for answer in answers:
        assert isinstance(answer, Heartbeat) or (
            isinstance(answer, Rejection) and answer.code is RejectionCode.DUPLICATE
        ), answer
        assert answer.revision == revision, answer
    taken = [a for a in answers if isinstance(a, Heartbeat)]
    assert taken, answers
    return taken


@pytest.mark.parametrize("runtime", ["native"])  # the rule is the shared pipeline's
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
                headers=env.sign("runtime", run_id.encode(), value),
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
    assert "discarding the stores" in again.log_path.read_text(errors="replace")
    _recreate(env, 6)
    grown = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    assert grown.wait(90) != 0, grown.log()
    log = grown.log_path.read_text(errors="replace")
    assert "has 6 partitions, but the state" in log and "murmur2" in log


V1_TEXT = (
    (Path(__file__).parents[2] / "processor/machines/task_lifecycle.yaml")
    .read_text()
    .replace("name: task_lifecycle", "name: deploy_task")
)
# The next deploy's edit: approvals come from the tool executor, and `blocked` is gone.
V2_TEXT = "\n".join(
    line
    for line in V1_TEXT.replace(
        "approval_granted: {authorities: [approver], approval: grant}",
        "approval_granted: {authorities: [tool_executor], approval: grant}",
    )
    .replace("paused, blocked, retrying", "paused, retrying")
    .replace("name: deploy_task", "name: deploy_task\nlabel: tools approve")
    .splitlines()
    if not any(d in line for d in ("to: blocked", "from: blocked", "state: blocked"))
)


# Native only: versions are decided by the shared engine over the catalog the CLI builds
# for either runtime (CI time).
@pytest.mark.parametrize("runtime", ["native"])
def test_a_machine_edited_between_two_deploys(env: Env, runtime: str) -> None:
    """Runs in flight go on under the version that created them, new runs get the new
    one, `migrate` moves one run and refuses another, and `verify` and `get --at` stay
    right: every version reaches every worker and auditor through the machines topic."""
    folder = env.tmp / "machines"
    folder.mkdir()
    (folder / "deploy_task.yaml").write_text(V1_TEXT)
    # An operator's key: the worker signs and publishes its machine files' versions.
    first = WorkerProcess(
        env,
        env.tmp / "w1",
        "--machine-path",
        str(folder),
        "--operator-key-id",
        "operator",
        runtime=runtime,
    )
    agent, tool, approver = env.client(), env.client("tool"), env.client("approver")
    operator = env.client("operator")
    try:
        first.wait_ready(partitions=3)
        created = {}
        for run_id in ("old-1", "old-2", "old-3"):
            created[run_id] = agent.create_and_wait(run_id, "deploy_task", deadlines=SLOW)
            assert isinstance(agent.propose_and_wait(run_id, "start"), Transition)
        paused = agent.propose_and_wait("old-1", "pause_for_approval")
        assert isinstance(paused, Transition)
        assert isinstance(agent.propose_and_wait("old-3", "block_on_dependency"), Transition)
        v1 = created["old-1"]
        assert isinstance(v1, Transition) and v1.machine_version is not None
        assert first.terminate() == 0, first.log()

        (folder / "deploy_task.yaml").write_text(V2_TEXT)  # the second deploy
        second = WorkerProcess(
            env,
            env.tmp / "w2",
            "--machine-path",
            str(folder),
            "--operator-key-id",
            "operator",
            runtime=runtime,
        )
        try:
            second.wait_ready(partitions=3)
            # old-1 is decided by the version it was created with: approvers approve
            refused = tool.decide("old-1", pause=paused.revision)
            assert isinstance(refused, Rejection) and refused.code is RejectionCode.UNAUTHORIZED
            approved = approver.decide("old-1", pause=paused.revision)
            assert isinstance(approved, Transition), approved
            assert approved.machine_version == v1.machine_version
            # a new run gets the new version: tools approve
            new = agent.create_and_wait("new-1", "deploy_task", deadlines=SLOW)
            assert isinstance(new, Transition) and new.machine_version != v1.machine_version
            v2 = new.machine_version
            agent.propose_and_wait("new-1", "start")
            new_pause = agent.propose_and_wait("new-1", "pause_for_approval")
            assert isinstance(new_pause, Transition)
            no = approver.decide("new-1", pause=new_pause.revision)
            assert isinstance(no, Rejection) and no.code is RejectionCode.UNAUTHORIZED
            assert isinstance(tool.decide("new-1", pause=new_pause.revision), Transition)
            # migrate: old-2 (running) moves; old-3 (blocked: gone in v2) is refused
            moved = operator.propose_and_wait("old-2", "migrate", payload={"version": v2})
            assert isinstance(moved, Transition) and moved.machine_version == v2, moved
            stuck = operator.propose_and_wait("old-3", "migrate", payload={"version": v2})
            assert isinstance(stuck, Rejection), stuck
            assert stuck.code is RejectionCode.INCOMPATIBLE_VERSION
            assert "'blocked' does not exist" in stuck.detail
            resolved = agent.propose_and_wait("old-3", "dependency_resolved")  # still v1
            assert isinstance(resolved, Transition) and resolved.to_state == "running"
        finally:
            assert second.terminate() == 0, second.log()
    finally:
        for client in (agent, tool, approver, operator):
            client.close()
    # auditors hold only the new file, and learn v1 from the machines topic
    versions = json.loads(runstate(env, "machines", "versions").stdout)
    assert {(v["machine"], v["version"]) for v in versions} >= {
        ("deploy_task", v1.machine_version),
        ("deploy_task", v2),
    }
    verified = runstate(
        env, "verify", "--keyring-file", str(env.keyring_path), "--machine-path", str(folder)
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    ring = ("--keyring-file", str(env.keyring_path))
    then = runstate(
        env, "get", "old-1", "--at", str(paused.at_ms), "--machine-path", str(folder), *ring
    )
    assert then.returncode == 0, then.stderr
    assert json.loads(then.stdout)["state"] == "paused"
    now = runstate(env, "get", "old-1", "--at", "9" * 13, "--machine-path", str(folder), *ring)
    assert json.loads(now.stdout)["machine_version"] == v1.machine_version


KEPT_TEXT = V1_TEXT.replace("name: deploy_task", "name: kept_task\nretention_ms: 1500")


def _forgotten_within(worker: WorkerProcess, run_id: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while worker.snapshot(run_id) is not None:
        assert time.monotonic() < deadline, f"{run_id} not forgotten within {timeout} s"
        time.sleep(0.2)


def test_finished_runs_are_forgotten_after_their_retention(env: Env, runtime: str) -> None:
    """A finished run goes from the store, the changelog and the dedupe memory once its
    machine's retention has passed; its transitions stay, the last one `forget`. The run
    id is free again, and a worker restoring from scratch knows only the new run."""
    folder = env.tmp / "machines"
    folder.mkdir()
    (folder / "kept_task.yaml").write_text(KEPT_TEXT)
    worker = WorkerProcess(env, env.tmp / "w1", "--machine-path", str(folder), runtime=runtime)
    agent = env.client()
    try:
        worker.wait_ready(partitions=3)
        assert isinstance(
            agent.create_and_wait("k1", "kept_task", proposal_id="k1-create"), Transition
        )
        agent.propose_and_wait("k1", "start")
        done = agent.propose_and_wait("k1", "complete")
        assert isinstance(done, Transition) and done.to_state == "done"
        assert worker.snapshot("k1") is not None
        _forgotten_within(worker, "k1")
        gone = agent.propose_and_wait("k1", "start")
        assert isinstance(gone, Rejection) and gone.code is RejectionCode.UNKNOWN_RUN
        # the id is free again, and its old proposal ids are forgotten with it
        again = agent.create_and_wait("k1", "kept_task", proposal_id="k1-create")
        assert isinstance(again, Transition) and again.revision == 0, again
    finally:
        agent.close()
        assert worker.terminate() == 0, worker.log()
    history = [t for t in published(env).transitions if t.run_id == "k1"]
    assert [(t.revision, t.event) for t in history] == [
        (0, "create"),
        (1, "start"),
        (2, "complete"),
        (3, "forget"),
        (0, "create"),
    ]
    assert history[3].reason == "retention"
    assert history[3].at_ms >= done.at_ms + 1500
    fresh = WorkerProcess(env, env.tmp / "w2", "--machine-path", str(folder), runtime=runtime)
    try:
        fresh.wait_ready(partitions=3)
        snapshot = fresh.snapshot("k1")
        assert snapshot is not None and snapshot.revision == 0
        served = fresh.get(fresh.run_path("k1", "/history"))
        assert [(t["revision"], t["event"]) for t in served] == [(0, "create")]
    finally:
        assert fresh.terminate() == 0, fresh.log()
