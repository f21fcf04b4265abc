"""An agent killed mid-step: the resume view a restarted agent builds from the
worker's snapshot and history shows the completed step with its result, the step left
executing and the checkpoint; the failed run is then continued as a new run carrying
them, the step of unknown outcome still executing. One native worker, one broker."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from processor.client import RunstateClient
from processor.history.resume import continuation_payload, continuation_problems, resume_view
from processor.kafka.config import KafkaSettings
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines
from schemas.codes import RejectionCode
from schemas.messages import Rejection, StepStatus, Transition
from tests.integration.harness import ROOT, Env, WorkerProcess, make_env
from tests.integration.resume_agent import CHECKPOINT


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def test_an_agent_killed_mid_step_is_resumed_and_its_failed_run_continued(env: Env) -> None:
    machines = builtin_machines()
    worker = WorkerProcess(env, env.tmp / "w1")
    ready = env.tmp / "agent-ready"
    agent: subprocess.Popen[bytes] | None = None
    try:
        worker.wait_ready(partitions=3)
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.resume_agent",
                env.bootstrap,
                env.topics.proposals.removesuffix("proposals"),
                str(env.keyring_path),
                "task-1",
                str(ready),
            ],
            cwd=ROOT,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert agent.poll() is None, agent.stderr.read() if agent.stderr else b""
            assert time.monotonic() < deadline, "the agent never reached step s2"
            time.sleep(0.1)
        agent.kill()  # SIGKILL, mid-step
        assert agent.wait(10) == -9

        # A restarted agent reads the run back from the worker and rebuilds its context.
        client = RunstateClient(
            KafkaSettings(env.bootstrap),
            env.topics,
            signing_key=env.signing_key("runtime"),
            worker_urls=[worker.url],
        )
        snapshot = client.snapshot("task-1")
        assert snapshot is not None
        history = client.history("task-1")
        assert [t.event for t in history] == [
            "create",
            "start",
            "step_started",
            "step_succeeded",
            "checkpoint",
            "step_started",
        ]
        view = resume_view(snapshot, history, machines)
        assert client.resume("task-1") == view  # the client's own resume view, the same
        assert (view.state, view.revision, view.finished) == ("running", 5, False)
        assert view.completed["s1"].result == {"rows": 42}
        assert set(view.executing) == {"s2"}
        assert view.executing["s2"].idempotency_key == "task-1/s2"
        assert view.executing["s2"].since_ms == history[5].at_ms
        assert view.checkpoint == CHECKPOINT and view.checkpoint_revision == 4
        assert "fatal_error" in {e.event for e in view.next_events}

        # s1 is done for good: the ledger refuses it with its result.
        again = client.propose_and_wait(
            "task-1", "step_started", payload={"step": "s1", "idempotency_key": "task-1/s1"}
        )
        assert isinstance(again, Rejection) and again.code is RejectionCode.DUPLICATE_STEP
        assert again.step_result == {"rows": 42}

        # The task fails; a new run continues it from what the old one committed.
        failed = client.propose_and_wait("task-1", "fatal_error", expected_revision=5)
        assert isinstance(failed, Transition) and failed.to_state == "failed"
        old = client.snapshot("task-1")
        assert old is not None and old.state == "failed"
        created = client.continue_run("task-2", "task-1")
        assert isinstance(created, Transition), created
        assert created.payload == continuation_payload(old, machines)
        new = client.snapshot("task-2")
        assert new is not None and new.continues is not None
        assert (new.continues.run_id, new.continues.revision) == ("task-1", 6)
        assert new.continues.hash == old.last_hash
        assert set(new.steps) == {"s1", "s2"} and new.steps["s1"].status is StepStatus.SUCCEEDED
        assert new.steps["s1"].result == {"rows": 42} and new.checkpoint == CHECKPOINT
        # s2's outcome is unknown: executing in the new run too, not to be run again blind
        assert new.steps["s2"].status is StepStatus.EXECUTING
        assert continuation_problems(created, old) == []
        successor = resume_view(new, client.history("task-2"), machines)
        assert successor.continues == new.continues and set(successor.executing) == {"s2"}
        assert successor.executing["s2"].idempotency_key == "task-1/s2"
        assert successor.completed["s1"].result == {"rows": 42}
        client.close()
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
        assert worker.terminate() == 0, worker.log()
