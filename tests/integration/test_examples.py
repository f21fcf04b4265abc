"""The examples run as a user runs them, on the real broker."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from processor.kafka.topics import TopicNames
from processor.trust.keyring import dump_signing_key
from tests.integration.harness import ROOT, Env, WorkerProcess, make_env

pytestmark = pytest.mark.integration


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def _agent(
    env: Env, url: str, *args: str, script: str = "examples/agent/task_agent.py"
) -> subprocess.CompletedProcess[str]:
    key = env.tmp / "runtime.key.json"
    key.write_text(dump_signing_key(env.signing_key("runtime")))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RUNSTATE_")}
    clean.update(
        RUNSTATE_BOOTSTRAP_SERVERS=env.bootstrap,
        RUNSTATE_TOPIC_PREFIX=env.topics.proposals.removesuffix("proposals"),
        RUNSTATE_WORKER_URL=url,
        RUNSTATE_SIGNING_KEY_FILE=str(key),
        PYTHONPATH=str(ROOT),
    )
    return subprocess.run(
        [sys.executable, script, *args],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_asyncio_agent_crashes_mid_step_and_resumes_where_it_was(env: Env) -> None:
    worker = WorkerProcess(env, env.tmp / "w1")
    try:
        worker.wait_ready(partitions=3)
        crashed = _agent(env, worker.url, "order-7", "--crash-in", "refund")
        assert crashed.returncode == -9, crashed.stdout + crashed.stderr
        assert json.loads(crashed.stdout.splitlines()[-1]) == {
            "event": "crashing",
            "step": "refund",
        }
        resumed = _agent(env, worker.url, "order-7")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        lines = [json.loads(line) for line in resumed.stdout.splitlines()]
        assert lines[0] == {
            "event": "resumed",
            "run_id": "order-7",
            "state": "running",
            "completed": ["validate"],
            "executing": ["refund"],
            "checkpoint": ["order", "plan", "validate"],
        }, lines
        assert [x.get("step") for x in lines if x["event"] == "step_done"] == ["refund", "notify"]
        assert lines[-1]["event"] == "completed", lines
        history = worker.get(worker.run_path("order-7", "/history"))
        started = [t["payload"]["step"] for t in history if t["event"] == "step_started"]
        assert started == ["validate", "refund", "refund", "notify"]  # validate ran once
    finally:
        assert worker.terminate() == 0, worker.log()


def test_the_langgraph_graph_is_killed_mid_node_and_goes_on_from_its_checkpoint(env: Env) -> None:
    worker = WorkerProcess(env, env.tmp / "w1")
    script = "examples/langgraph/refund_graph.py"
    try:
        worker.wait_ready(partitions=3)
        crashed = _agent(env, worker.url, "order-9", "--crash-in", "refund", script=script)
        assert crashed.returncode == -9, crashed.stdout + crashed.stderr
        ran = [json.loads(line)["node"] for line in crashed.stdout.splitlines()]
        assert ran == ["validate", "refund"]
        resumed = _agent(env, worker.url, "order-9", script=script)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        lines = [json.loads(line) for line in resumed.stdout.splitlines()]
        assert [x["node"] for x in lines if x["event"] == "node"] == ["refund", "notify"]
        assert lines[-1] == {
            "event": "finished",
            "resumed": True,
            "done": ["validate", "refund", "notify"],
        }
        history = worker.get(worker.run_path("langgraph:order-9", "/history"))
        assert [t["event"] for t in history][:2] == ["create", "start"]
        assert {t["event"] for t in history[2:]} == {"checkpoint"}
        assert {t["principal"]["authority"] for t in history} == {"runtime"}
    finally:
        assert worker.terminate() == 0, worker.log()


def test_the_readmes_example_runs_as_written(env: Env) -> None:
    """The README's SDK example, with this broker's address, topics, key and worker in
    place of the ones it names."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    key = env.tmp / "keys.private" / "runtime.key.json"
    key.parent.mkdir()
    key.write_text(dump_signing_key(env.signing_key("runtime")))
    worker = WorkerProcess(env, env.tmp / "w1")
    try:
        worker.wait_ready(partitions=3)
        prefix = env.topics.proposals.removesuffix("proposals")
        for written, here in (
            ('KafkaSettings("127.0.0.1:9092")', f'KafkaSettings("{env.bootstrap}")'),
            ("TopicNames.with_prefix()", f'TopicNames.with_prefix("{prefix}")'),
            ('"http://127.0.0.1:8080"', f'"{worker.url}"'),
        ):
            assert written in code, written
            code = code.replace(written, here)
        for _ in range(2):  # and again: every call answered with what the first committed
            ran = subprocess.run(
                [sys.executable, "-c", code],
                cwd=env.tmp,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert ran.returncode == 0, ran.stdout + ran.stderr
            assert ran.stdout == "running 2\n", ran.stdout
        snapshot = worker.get(worker.run_path("refund-42"))
        assert snapshot["state"] == "running"
        assert snapshot["steps"]["refund"]["status"] == "executing"
        assert snapshot["revision"] == 2
    finally:
        assert worker.terminate() == 0, worker.log()
