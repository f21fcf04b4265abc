"""GET /runs/<id>/history on the Faust runtime: the run's transitions, oldest first, read
from the transitions topic (repeats after a crash counted once), as the native API."""

import json
from pathlib import Path

import pytest
from confluent_kafka import Producer

from processor.kafka.partitioning import partition_for
from processor.kafka.topics import TopicNames
from processor.runtimes.faust.table import proposal_key
from schemas.messages import Transition
from tests.integration.harness import Env, WorkerProcess, make_env, published

M = "task_lifecycle"


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def test_faust_history_is_the_runs_transitions_oldest_first(env: Env) -> None:
    worker = WorkerProcess(env, env.tmp / "w1", runtime="faust")
    client = env.client()
    try:
        worker.wait_ready(partitions=3)
        for run_id in ("hist-1", "hist-2"):
            assert isinstance(
                client.create_and_wait(run_id, M, deadlines={"retry_backoff_ms": 600_000}),
                Transition,
            )
            assert isinstance(client.propose_and_wait(run_id, "start"), Transition)
        assert isinstance(client.propose_and_wait("hist-1", "transient_error"), Transition)
        history = worker.get(worker.run_path("hist-1", "/history"))
        assert worker.get(worker.run_path("nobody", "/history")) is None  # 404
    finally:
        client.close()
        assert worker.terminate() == 0, worker.log()
    expected = sorted(
        (t for t in published(env).transitions if t.run_id == "hist-1"), key=lambda t: t.revision
    )
    assert [t["revision"] for t in history] == [0, 1, 2]
    assert history == [json.loads(t.model_dump_json()) for t in expected]

    # A crash between an outcome's proposal-id record and its snapshot, staged: the id
    # of a proposal hist-2 never took (its revision, 2, is past the run's 1) is in the
    # changelog. A worker restoring from it decides that proposal again, as a commit at
    # revision 2 (it was refused `duplicate`, and the next proposal took revision 2).
    stray = Producer({"bootstrap.servers": env.bootstrap})
    stray.produce(
        env.topics.changelog,
        b"2",
        proposal_key("hist-2", "late-error"),
        partition=partition_for("hist-2", 3),
    )
    assert stray.flush(30) == 0
    again = WorkerProcess(env, env.tmp / "w2", runtime="faust")
    client = env.client()
    try:
        again.wait_ready(partitions=3)
        late = client.propose_and_wait("hist-2", "transient_error", proposal_id="late-error")
        assert isinstance(late, Transition) and late.revision == 2, late
    finally:
        client.close()
        assert again.terminate() == 0, again.log()
