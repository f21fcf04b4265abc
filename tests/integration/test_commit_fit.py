"""A commit whose records each fit the changelog but together do not fit one batch of it,
on a real broker: refused `state_too_large` (never the DLQ), and the client's wait
returns that rejection. First with the changelog's limit known at start; then with the
limit lowered under a running worker, whose producer still batches up to the old one: the
broker refuses the batch, the worker reads the limits again and decides it again.
"""

import base64
import os
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from processor.client import RunstateClient
from processor.kafka.config import KafkaSettings
from processor.kafka.readback import read_topics
from processor.kafka.topic_checks import max_message_bytes
from processor.kafka.topics import TopicNames
from schemas.codes import RejectionCode
from schemas.messages import DeadLetter, Rejection, Transition
from tests.integration.harness import Env, WorkerProcess, make_env

PARTITIONS = 3
MAX_STATE_BYTES = 8_000
#: The changelog's limit: each record of a commit below fits it (and --max-state-bytes),
#: the history record and the snapshot together do not.
SMALL_LIMIT = 10_000
LARGE_LIMIT = 40_000
RESULT_BYTES = 3_600  # random, base64: ~4,800 characters, which no codec shrinks much
DECIDED_WITHIN_S = 30.0


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def _set_limit(admin: AdminClient, topic: str, size: int) -> None:
    """Set the topic's max.message.bytes and wait until the broker reports it."""
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(size), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result()
    deadline = time.monotonic() + 30
    while max_message_bytes(admin, [topic]).get(topic) != size:
        assert time.monotonic() < deadline, f"{topic} does not report {size} after 30 s"
        time.sleep(0.2)


def _decided(client: RunstateClient, run_id: str, event: str, **kw: Any) -> Transition | Rejection:
    outcome = client.propose_and_wait(run_id, event, timeout=DECIDED_WITHIN_S, **kw)
    assert isinstance(outcome, Transition | Rejection), outcome
    return outcome


def _step(
    client: RunstateClient, run_id: str, step: str
) -> tuple[Transition, Transition | Rejection]:
    """A step started, then succeeded with a result that lands in the transition (the
    history record) and in the run's snapshot alike: (started, the success's outcome)."""
    started = _decided(
        client, run_id, "step_started", payload={"step": step, "idempotency_key": step}
    )
    assert isinstance(started, Transition), started
    result = {"blob": base64.b64encode(os.urandom(RESULT_BYTES)).decode()}
    succeeded = _decided(client, run_id, "step_succeeded", payload={"step": step, "result": result})
    return started, succeeded


def _started(client: RunstateClient, run_id: str) -> Transition:
    created = _decided(client, run_id, "create", payload={"machine": "task_lifecycle"})
    assert isinstance(created, Transition), created
    started = _decided(client, run_id, "start")
    assert isinstance(started, Transition), started
    return started


def _first_refused_step(
    client: RunstateClient, prefix: str
) -> tuple[str, Transition, Transition | Rejection]:
    """Start a run and step it, a run each, until the step's commit is refused: (run id,
    the step's start, the refusal). The broker reports a topic's lowered limit before its
    log applies it; a commit taken in that wake fits the limit in force, as decided."""
    deadline = time.monotonic() + 30
    n = 0
    while True:
        run_id = f"{prefix}-{n}"
        _started(client, run_id)
        before, outcome = _step(client, run_id, "s1")
        if not isinstance(outcome, Transition):
            return run_id, before, outcome
        assert time.monotonic() < deadline, f"{prefix}: steps still taken after 30 s"
        n += 1


def _assert_refused_for_the_batch(
    outcome: Transition | Rejection, env: Env, before: Transition, label: str
) -> None:
    assert isinstance(outcome, Rejection), f"[{label}] committed: {outcome}"
    assert outcome.code is RejectionCode.STATE_TOO_LARGE, f"[{label}] {outcome}"
    assert env.topics.changelog in outcome.detail, f"[{label}] {outcome.detail}"
    assert str(SMALL_LIMIT - 128) in outcome.detail, f"[{label}] {outcome.detail}"
    assert (outcome.state, outcome.revision) == ("running", before.revision), f"[{label}]"
    letters = [
        DeadLetter.model_validate_json(m.value() or b"")
        for m in read_topics(KafkaSettings(env.bootstrap), [env.topics.dlq])
    ]
    assert not letters, f"[{label}] DLQ records: {letters}"


def _assert_alive(worker: WorkerProcess, label: str) -> None:
    assert worker.proc.poll() is None, f"[{label}] the worker exited:\n{worker.log()}"
    text = worker.log_path.read_text(errors="replace")
    for sign in ("restarting the worker in place", "Traceback", "internal error while"):
        assert sign not in text, f"[{label}] worker log shows {sign!r}:\n{worker.log()}"


def test_a_commit_that_one_batch_of_the_changelog_cannot_hold_is_refused(
    env: Env, admin: AdminClient
) -> None:
    client = env.client()
    extra = ("--max-state-bytes", str(MAX_STATE_BYTES))
    # 1. known at start: the changelog takes smaller batches than the producer makes
    _set_limit(admin, env.topics.changelog, SMALL_LIMIT)
    worker = WorkerProcess(env, env.tmp / "w", *extra)
    try:
        worker.wait_ready(partitions=PARTITIONS)
        client.waiter()
        _started(client, "fit-start")
        before, outcome = _step(client, "fit-start", "s1")
        _assert_refused_for_the_batch(outcome, env, before, "at start")
        snapshot = worker.snapshot("fit-start")
        assert snapshot is not None and snapshot.revision == before.revision, snapshot
        _assert_alive(worker, "at start")
    finally:
        worker.terminate(60)

    # 2. lowered under a running worker that learned a larger limit. Uncompressed: the
    # broker checks a batch as sent, and lz4 halves one whose history record and snapshot
    # carry the same step result (the check before sending counts them uncompressed).
    _set_limit(admin, env.topics.changelog, LARGE_LIMIT)
    worker = WorkerProcess(env, env.tmp / "w", *extra, "-X", "compression.type=none")
    try:
        worker.wait_ready(partitions=PARTITIONS)
        _started(client, "fit-large")
        _, taken = _step(client, "fit-large", "s1")  # one batch of the large limit holds it
        assert isinstance(taken, Transition), taken
        _set_limit(admin, env.topics.changelog, SMALL_LIMIT)
        lowered, before, outcome = _first_refused_step(client, "fit-lowered")
        _assert_refused_for_the_batch(outcome, env, before, "lowered")
        text = worker.log_path.read_text(errors="replace")
        assert "MSG_SIZE_TOO_LARGE" in text, worker.log()  # the broker refused the batch
        assert "deciding again within them" in text, worker.log()
        # the run goes on, within the new limit: the step is settled, then it completes
        settled = _decided(
            client, lowered, "step_failed", payload={"step": "s1", "error": "too large"}
        )
        assert isinstance(settled, Transition), settled
        done = _decided(client, lowered, "complete")
        assert isinstance(done, Transition) and done.to_state == "done", done
        _assert_alive(worker, "lowered")
    finally:
        worker.terminate(60)
