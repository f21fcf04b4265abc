"""Machine versions are operator authority, on the real broker: a version a runtime key
(or nobody) published on the machines topic is refused by the worker (logged, on the
DLQ with the reason), a migration to it is refused, and `verify` names it."""

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from processor.engine.parse import parse_machine
from processor.history.versions import version_key
from processor.kafka.config import KafkaSettings
from processor.kafka.readback import read_topics
from processor.kafka.topics import TopicNames
from processor.machines import builtin_source
from schemas.codes import RejectionCode
from schemas.messages import DeadLetter, Rejection, Transition
from tests.integration.harness import Env, WorkerProcess, make_env, runstate

pytestmark = pytest.mark.integration

V1_TEXT = builtin_source("task_lifecycle").replace("name: task_lifecycle", "name: ops_task")
# What a runtime key's owner would like runs to be decided by: tools approve.
V2_TEXT = V1_TEXT.replace(
    "approval_granted: {authorities: [approver], approval: grant}",
    "approval_granted: {authorities: [tool_executor], approval: grant}",
).replace("name: ops_task", "name: ops_task\nlabel: tools approve")
V3_TEXT = V2_TEXT.replace("label: tools approve", "label: unsigned")
V4_TEXT = V1_TEXT.replace("name: ops_task", "name: ops_task\nlabel: the operator's")


@pytest.fixture(params=["native", "faust"])
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def _publish_as(env: Env, text: str, key_id: str | None) -> str:
    """A version onto the machines topic, straight from a producer: signed with `key_id`
    (None: unsigned). Returns its version."""
    machine = parse_machine(text)
    key = version_key(machine)
    value = machine.spec.model_dump_json(by_alias=True).encode()
    headers = (
        []
        if key_id is None
        else env.signing_key(key_id).headers(
            env.topics.machines, key, value, int(time.time() * 1000)
        )
    )
    producer = Producer({"bootstrap.servers": env.bootstrap})
    producer.produce(env.topics.machines, value, key, headers=headers)
    assert producer.flush(30) == 0
    return machine.version


def _dead_letters(env: Env, deadline_s: float = 60.0, want: int = 2) -> list[DeadLetter]:
    deadline = time.monotonic() + deadline_s
    while True:
        found = [
            DeadLetter.model_validate_json(m.value())
            for m in read_topics(KafkaSettings(env.bootstrap), [env.topics.dlq])
            if m.value() is not None
        ]
        found = [d for d in found if d.topic == env.topics.machines]
        if len(found) >= want or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_a_version_no_operator_signed_takes_no_effect(env: Env, runtime: str) -> None:
    folder = env.tmp / "machines"
    folder.mkdir()
    (folder / "ops_task.yaml").write_text(V1_TEXT)
    # The deploy: an operator's key signs and publishes the worker's machine files.
    first = WorkerProcess(
        env,
        env.tmp / "w1",
        "--machine-path",
        str(folder),
        "--operator-key-id",
        "operator",
        runtime=runtime,
    )
    agent, operator = env.client(), env.client("operator")
    try:
        first.wait_ready(partitions=3)
        created = agent.create_and_wait("r1", "ops_task")
        assert isinstance(created, Transition) and created.machine_version is not None
        assert isinstance(agent.propose_and_wait("r1", "start"), Transition)
        assert first.terminate() == 0, first.log()

        # The runtime key's owner publishes a version with the edge it wants; another
        # goes on unsigned.
        forged = _publish_as(env, V2_TEXT, "runtime")
        unsigned = _publish_as(env, V3_TEXT, None)

        second = WorkerProcess(env, env.tmp / "w2", "--machine-path", str(folder), runtime=runtime)
        try:
            second.wait_ready(partitions=3)
            letters = _dead_letters(env)
            assert len(letters) == 2, [d.error for d in letters]
            errors = " | ".join(d.error for d in letters)
            assert "'runtime' (runtime, runtime), which is not an operator's key" in errors
            assert "record is not signed" in errors
            assert all(d.error.startswith("machine version refused") for d in letters)
            log = second.log_path.read_text(errors="replace")
            assert f"ops_task@{forged}" in log and f"ops_task@{unsigned}" in log
            assert "ERROR" in log and "machine version refused, not used" in log
            # The runtime key may not migrate; an operator may not migrate to a version
            # that never took effect either.
            for target in (forged, unsigned):
                refused = agent.propose_and_wait("r1", "migrate", payload={"version": target})
                assert isinstance(refused, Rejection), refused
                assert refused.code is RejectionCode.UNAUTHORIZED
                assert "operator's key" in refused.detail
                missing = operator.propose_and_wait("r1", "migrate", payload={"version": target})
                assert isinstance(missing, Rejection), missing
                assert missing.code is RejectionCode.UNKNOWN_MACHINE
            # the run is still decided by v1: approvers approve, tools may not
            paused = agent.propose_and_wait("r1", "pause_for_approval")
            assert isinstance(paused, Transition)
            tool = env.client("tool")
            no = tool.decide("r1", pause=paused.revision)
            tool.close()
            assert isinstance(no, Rejection) and no.code is RejectionCode.UNAUTHORIZED
        finally:
            assert second.terminate() == 0, second.log()
    finally:
        agent.close()
        operator.close()

    verified = runstate(
        env,
        "verify",
        "--json",
        "--keyring-file",
        str(env.keyring_path),
        "--machine-path",
        str(folder),
    )
    assert verified.returncode == 1, verified.stdout + verified.stderr
    found = json.loads(verified.stdout)["differences"]
    flagged = [f for f in found if f["topic"] == "machines"]
    assert len(flagged) == 2 and len(found) == 2, found
    text = " ".join(f["detail"] for f in flagged)
    assert f"ops_task@{forged}" in text and f"ops_task@{unsigned}" in text

    # `machines publish` signs with an operator's key only, and what it signs is taken
    ring = ("--keyring-file", str(env.keyring_path), "--machine-path", str(folder))
    refused = runstate(env, "machines", "publish", *ring, "--key-id", "runtime")
    assert refused.returncode == 1 and "not an operator's key" in refused.stderr, refused.stderr
    (folder / "ops_task.yaml").write_text(V4_TEXT)
    signed = runstate(env, "machines", "publish", *ring)
    assert signed.returncode == 0, signed.stderr
    v4 = parse_machine(V4_TEXT).version
    assert json.loads(signed.stdout)["published"] == [f"ops_task@{v4}"]
    (folder / "ops_task.yaml").write_text(V1_TEXT)  # the auditor holds only v1's file
    again = runstate(env, "verify", "--json", *ring)
    assert [f["detail"] for f in json.loads(again.stdout)["differences"]] == [
        f["detail"] for f in flagged
    ]
