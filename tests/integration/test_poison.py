"""Poison records on a real broker: each is set aside (a rejection or a DLQ record), the
worker never exits, its partition goes on, and a second worker serves the same state.
And a late approval: produced while no worker ran, after the approval deadline fell
due, it is refused `deadline_passed` and the deadline fails the run.

Classes (test_poison_records_are_set_aside_and_the_partition_goes_on):
  a. an unsigned proposal whose run_id is a lone surrogate (JSON `\\ud800` escape)
  b. ~900 KB of random bytes, and a 64 KiB key (DLQ, truncated, length and SHA-256 kept)
  c. a run whose state grows past --max-state-bytes (state_too_large, the run stays)
  d. a signed create whose run_id spells the store's fired-marks prefix (control chars)
  e. a key that differs from the run_id only in invalid UTF-8 (no run created)
  f. the broker refusing an outcome (rejections topic's max.message.bytes lowered under
     the running worker): the worker reads the limits again and publishes the rejection
     cut to fit them (step_result left out), never the DLQ
"""

import base64
import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from processor.client import OutcomeTimeout, RunstateClient, approval_payload
from processor.kafka.config import KafkaSettings
from processor.kafka.partitioning import murmur2, partition_for
from processor.kafka.readback import read_topics
from processor.kafka.topics import TopicNames
from schemas.codes import RejectionCode
from schemas.messages import DeadLetter, Proposal, Rejection, RunSnapshot, Transition
from tests.integration.harness import Env, WorkerProcess, eventually, make_env, published

PARTITIONS = 3  # the topic_names fixture's
DECIDED_WITHIN_S = 15.0  # every ordinary proposal behind a poison record is decided within
MAX_STATE_BYTES = 60_000
STEP_RESULT_CHARS = 20_000
LOWERED_REJECTIONS_LIMIT = 2_000


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


# -- helpers ----------------------------------------------------------------------
def _worker(env: Env, state: str, *extra: str) -> WorkerProcess:
    return WorkerProcess(env, env.tmp / state, "--max-state-bytes", str(MAX_STATE_BYTES), *extra)


def _stop(worker: WorkerProcess | None) -> None:
    """Cleanup after a failure: stop a worker that is still running, whatever happens."""
    if worker is not None and worker.proc.poll() is None:
        try:
            worker.terminate(30)
        except Exception:  # already failing: don't hide the cause
            worker.kill()


def _full_log(worker: WorkerProcess) -> str:
    return worker.log_path.read_text(errors="replace")


def _assert_alive(worker: WorkerProcess, label: str) -> None:
    """The worker process never exited, never restarted itself, never hit a bug."""
    assert worker.proc.poll() is None, (
        f"[{label}] the worker exited ({worker.proc.returncode}):\n{worker.log()}"
    )
    text = _full_log(worker)
    for sign in ("restarting the worker in place", "Traceback", "internal error while"):
        assert sign not in text, f"[{label}] worker log shows {sign!r}:\n{worker.log()}"


def _key_partition(key: bytes) -> int:
    """The partition the default (murmur2) partitioner picks for a record key."""
    return (murmur2(key) & 0x7FFFFFFF) % PARTITIONS


def _runs_on(partition: int, prefix: str, count: int = 2) -> list[str]:
    found: list[str] = []
    i = 0
    while len(found) < count:
        run_id = f"{prefix}-{i}"
        if partition_for(run_id, PARTITIONS) == partition:
            found.append(run_id)
        i += 1
    return found


class RawProducer:
    """Produces exact bytes to a chosen partition of the proposals topic."""

    def __init__(self, env: Env) -> None:
        self.topic = env.topics.proposals
        self._producer = Producer({"bootstrap.servers": env.bootstrap, "log_level": 4})

    def send(
        self,
        partition: int,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> int:
        """The record's offset, once the broker has it."""
        delivered: list[tuple[KafkaError | None, Any]] = []
        self._producer.produce(
            self.topic,
            key=key,
            value=value,
            partition=partition,
            headers=headers,
            on_delivery=lambda err, msg: delivered.append((err, msg)),
        )
        self._producer.flush(30)
        assert delivered, "the poison record was not delivered within 30 s"
        err, msg = delivered[0]
        assert err is None, f"producing the poison record failed: {err}"
        offset: int = msg.offset()
        return offset


def _signed(
    env: Env, key: bytes | None, value: bytes, key_id: str = "runtime"
) -> list[tuple[str, str | bytes | None]]:
    return env.sign(key_id, key, value)


def _create_value(proposal_id: str, run_id: str) -> bytes:
    """A create proposal as raw JSON (json.dumps writes `\\u0000` etc. as escapes)."""
    return json.dumps(
        {
            "proposal_id": proposal_id,
            "run_id": run_id,
            "event": "create",
            "payload": {"machine": "task_lifecycle", "options": {}},
        }
    ).encode()


def _dead_letters(env: Env) -> list[tuple[bytes | None, DeadLetter, int]]:
    """Every DLQ record: (record key, the letter, size of key + value)."""
    out = []
    for msg in read_topics(KafkaSettings(env.bootstrap), [env.topics.dlq]):
        value = msg.value() or b""
        out.append(
            (msg.key(), DeadLetter.model_validate_json(value), len(value) + len(msg.key() or b""))
        )
    return out


def _dead_letter_at(
    env: Env, partition: int, offset: int, timeout: float = DECIDED_WITHIN_S
) -> tuple[bytes | None, DeadLetter, int]:
    def probe() -> tuple[bytes | None, DeadLetter, int] | None:
        for key, letter, size in _dead_letters(env):
            if (letter.topic, letter.partition, letter.offset) == (
                env.topics.proposals,
                partition,
                offset,
            ):
                return key, letter, size
        return None

    return eventually(f"DLQ record for proposals[{partition}]@{offset}", probe, timeout)


def _rejections(env: Env, proposal_id: str) -> list[Rejection]:
    return [r for r in published(env).rejections if r.proposal_id == proposal_id]


def _outcome_of(env: Env, partition: int, offset: int, proposal_id: str) -> Rejection | DeadLetter:
    """The poison record's outcome: a rejection naming its proposal id, or a DLQ record."""

    def probe() -> Rejection | DeadLetter | None:
        rejections = _rejections(env, proposal_id)
        if rejections:
            return rejections[0]
        for _, letter, _ in _dead_letters(env):
            if (letter.partition, letter.offset) == (partition, offset):
                return letter
        return None

    found = eventually(
        f"outcome of {proposal_id} (proposals[{partition}]@{offset})", probe, DECIDED_WITHIN_S
    )
    return cast(Rejection | DeadLetter, found)


def _follow_ups(
    client: RunstateClient, worker: WorkerProcess, partition: int, label: str
) -> list[str]:
    """Two new runs on the poison record's partition, created and started right behind
    it: every one of these proposals is decided (a transition) within DECIDED_WITHIN_S
    of being sent, and the worker is still the same live process."""
    runs = _runs_on(partition, "after-" + re.sub(r"\W+", "-", label).strip("-"))
    began = time.monotonic()
    sent = []
    for run_id in runs:
        sent.append((run_id, "create", client.create(run_id, "task_lifecycle")))
        sent.append((run_id, "start", client.propose(run_id, "start")))
    client.flush()
    for run_id, event, proposal_id in sent:
        left = began + DECIDED_WITHIN_S - time.monotonic()
        try:
            outcome = client.wait(proposal_id, max(0.1, left))
        except OutcomeTimeout:
            pytest.fail(
                f"[{label}] '{event}' of {run_id} (partition {partition}, behind the poison "
                f"record) not decided within {DECIDED_WITHIN_S:.0f}s:\n{worker.log()}"
            )
        assert isinstance(outcome, Transition), f"[{label}] '{event}' of {run_id}: {outcome}"
    _assert_alive(worker, label)
    return runs


def _decided(client: RunstateClient, run_id: str, event: str, **kw: Any) -> Transition | Rejection:
    try:
        return client.propose_and_wait(run_id, event, timeout=DECIDED_WITHIN_S, **kw)
    except OutcomeTimeout:
        pytest.fail(f"'{event}' of {run_id} not decided within {DECIDED_WITHIN_S:.0f}s")


def _committed(client: RunstateClient, run_id: str, event: str, **kw: Any) -> Transition:
    outcome = _decided(client, run_id, event, **kw)
    assert isinstance(outcome, Transition), f"'{event}' of {run_id} was refused: {outcome}"
    return outcome


def _set_max_message_bytes(admin: AdminClient, topic: str, size: int) -> None:
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(size), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result()


def _wait_until_refused(env: Env, topic: str, partition: int, size: int) -> None:
    """Until the broker refuses a record of `size` bytes on `topic` (the lowered limit is
    in force). A probe that is still taken is a valid rejection no test looks for."""
    producer = Producer({"bootstrap.servers": env.bootstrap, "log_level": 4})
    deadline = time.monotonic() + 30
    n = 0
    while True:
        n += 1
        probe = Rejection(
            code=RejectionCode.SCHEMA_INVALID,
            detail="probe " + base64.b64encode(os.urandom(size)).decode()[:size],
            proposal_id=f"probe-{n}",
            at_ms=int(time.time() * 1000),
        ).model_dump_json()
        errors: list[KafkaError | None] = []

        def delivered(err: KafkaError | None, msg: Any, errors: list[Any] = errors) -> None:
            errors.append(err)

        producer.produce(topic, value=probe.encode(), partition=partition, on_delivery=delivered)
        producer.flush(30)
        if errors and errors[0] is not None:
            assert errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, errors[0]
            return
        assert time.monotonic() < deadline, f"{topic} still takes {size}-byte records after 30 s"
        time.sleep(0.3)


# -- 1. poison classes ------------------------------------------------------------
def test_poison_records_are_set_aside_and_the_partition_goes_on(
    env: Env, admin: AdminClient
) -> None:
    worker: WorkerProcess | None = _worker(env, "w1")
    second: WorkerProcess | None = None
    client = env.client()
    raw = RawProducer(env)
    served: list[str] = []  # runs the second worker must serve as the first did
    absent: list[str] = []  # run ids that must not exist anywhere
    try:
        assert worker is not None
        worker.wait_ready(partitions=PARTITIONS)
        client.waiter()  # outcomes are followed from here on

        # a. unsigned, run_id a lone surrogate (the escape in the JSON bytes), odd key
        key = b"a\xed\xa0\x80"  # the surrogate's (invalid) UTF-8 bytes
        value = (
            b'{"proposal_id": "poison-a", "run_id": "a\\ud800", "event": "create", '
            b'"payload": {"machine": "task_lifecycle", "options": {}}}'
        )
        assert b"\\ud800" in value
        p = _key_partition(key)
        offset = raw.send(p, key, value)
        served += _follow_ups(client, worker, p, "a: lone surrogate run_id")
        outcome = _outcome_of(env, p, offset, "poison-a")
        if isinstance(outcome, Rejection):
            assert outcome.code is RejectionCode.SCHEMA_INVALID, f"[a] {outcome}"
            assert outcome.run_id is None, f"[a] the rejection echoes an invalid run_id: {outcome}"
        else:
            assert "internal error" not in outcome.error, f"[a] {outcome}"

        # b. ~900 KB of random bytes (not JSON), then a 64 KiB key
        blob = b"\xff" + os.urandom(900 * 1024 - 1)
        p = _key_partition(b"blob")
        offset = raw.send(p, b"blob", blob)
        served += _follow_ups(client, worker, p, "b: 900 KB of random bytes")
        record_key, letter, size = _dead_letter_at(env, p, offset)
        assert size <= 1_000_000, f"[b] the DLQ record is {size} bytes"
        assert letter.truncated, f"[b] {letter.error}"
        assert letter.value_length == len(blob), f"[b] value_length {letter.value_length}"
        assert letter.value_sha256 == hashlib.sha256(blob).hexdigest(), "[b] value_sha256"
        kept = base64.b64decode(letter.value_base64 or "")
        assert 500_000 < len(kept) < len(blob) and blob.startswith(kept), (
            f"[b] the DLQ keeps {len(kept)} bytes, not a prefix of the value that fits"
        )
        assert "JSON" in letter.error, f"[b] {letter.error}"
        assert record_key == b"blob"

        huge_key = b"\xfe" + os.urandom(64 * 1024 - 1)
        blob = os.urandom(850 * 1024)
        p = _key_partition(huge_key)
        offset = raw.send(p, huge_key, blob)
        served += _follow_ups(client, worker, p, "b: 64 KiB key")
        record_key, letter, size = _dead_letter_at(env, p, offset)
        assert size <= 1_000_000, f"[b, huge key] the DLQ record is {size} bytes"
        assert record_key is None, "[b, huge key] a 64 KiB key was kept as the DLQ record's key"
        assert letter.truncated
        assert letter.key_length == len(huge_key), f"[b, huge key] key_length {letter.key_length}"
        assert letter.key_sha256 == hashlib.sha256(huge_key).hexdigest(), "[b] key_sha256"
        kept_key = base64.b64decode(letter.key_base64 or "")
        assert len(kept_key) <= 256 and huge_key.startswith(kept_key), "[b] key prefix"
        assert letter.value_length == len(blob)
        assert letter.value_sha256 == hashlib.sha256(blob).hexdigest()
        assert blob.startswith(base64.b64decode(letter.value_base64 or ""))

        # c. a run whose state grows past --max-state-bytes
        grow = _runs_on(0, "grow", 1)[0]
        p = partition_for(grow, PARTITIONS)
        last = _committed(
            client, grow, "create", payload={"machine": "task_lifecycle", "options": {}}
        )
        last = _committed(client, grow, "start")
        refused: Rejection | None = None
        for k in range(1, 10):
            step = f"s{k}"
            decision = _decided(
                client,
                grow,
                "step_started",
                payload={"step": step, "idempotency_key": f"{grow}:{step}"},
            )
            if isinstance(decision, Transition):
                last = decision
                decision = _decided(
                    client,
                    grow,
                    "step_succeeded",
                    payload={"step": step, "result": {"blob": "x" * STEP_RESULT_CHARS}},
                )
            if isinstance(decision, Rejection):
                refused = decision
                break
            last = decision
        assert refused is not None, "[c] the state never became too large"
        assert refused.code is RejectionCode.STATE_TOO_LARGE, f"[c] {refused}"
        assert str(MAX_STATE_BYTES) in refused.detail, f"[c] {refused.detail}"
        assert (refused.state, refused.revision) == ("running", last.revision), f"[c] {refused}"
        assert last.revision >= 3, f"[c] refused too early, at revision {last.revision}"
        snapshot = worker.snapshot(grow)
        assert snapshot is not None and snapshot.revision == last.revision, (
            f"[c] the run moved on after state_too_large: {snapshot and snapshot.revision}"
        )
        assert len(snapshot.model_dump_json()) <= MAX_STATE_BYTES
        served += _follow_ups(client, worker, p, "c: state too large")
        # the run goes on: the step whose result did not fit is settled, then it completes
        settled = _committed(
            client, grow, "step_failed", payload={"step": step, "error": "result too large"}
        )
        assert settled.revision == last.revision + 1, f"[c] {settled}"
        done = _committed(client, grow, "complete")
        assert (done.to_state, done.revision) == ("done", last.revision + 2), f"[c] {done}"
        served.append(grow)

        # d. a signed create whose run_id starts with the fired-marks prefix "\0fired\0"
        spoof = "\u0000fired\u0000victim"
        value = _create_value("poison-d", spoof)
        assert b"\\u0000fired\\u0000" in value
        p = _key_partition(spoof.encode())
        offset = raw.send(p, spoof.encode(), value, _signed(env, spoof.encode(), value))
        served += _follow_ups(client, worker, p, "d: control characters in run_id")
        outcome = _outcome_of(env, p, offset, "poison-d")
        assert isinstance(outcome, Rejection), f"[d] {outcome}"
        assert outcome.code is RejectionCode.SCHEMA_INVALID, f"[d] {outcome}"
        assert outcome.run_id is None, f"[d] the rejection echoes an invalid run_id: {outcome}"
        absent.append(spoof)

        # e. key = run_id in UTF-8 + an invalid byte; the value's run_id has U+FFFD there
        base = next(
            f"split-{i}"
            for i in range(1000)
            if _key_partition(f"split-{i}".encode() + b"\xff")
            != partition_for(f"split-{i}\ufffd", PARTITIONS)
        )
        key = base.encode() + b"\xff"
        assert key.decode(errors="replace") == base + "\ufffd"
        value = _create_value("poison-e", base + "\ufffd")
        p = _key_partition(key)
        offset = raw.send(p, key, value, _signed(env, key, value))
        served += _follow_ups(client, worker, p, "e: key differs in invalid UTF-8")
        outcome = _outcome_of(env, p, offset, "poison-e")
        assert isinstance(outcome, Rejection), f"[e] {outcome}"
        assert outcome.code is RejectionCode.SCHEMA_INVALID, f"[e] {outcome}"
        assert "key" in outcome.detail, f"[e] {outcome.detail}"
        for run_id in (base, base + "\ufffd"):
            assert worker.snapshot(run_id) is None, f"[e] run {run_id!r} was created"
        absent += [base, base + "\ufffd"]

        # f. the broker refuses an outcome: the rejections topic's limit lowered under
        # the running worker (which learned the old one at start)
        big = _runs_on(1, "big", 1)[0]
        p = partition_for(big, PARTITIONS)
        # incompressible, so the batch stays over the lowered limit whatever the codec
        result: dict[str, Any] = {"blob": base64.b64encode(os.urandom(15_000)).decode()}
        _committed(client, big, "create", payload={"machine": "task_lifecycle", "options": {}})
        _committed(client, big, "start")
        _committed(client, big, "step_started", payload={"step": "fetch", "idempotency_key": "k"})
        before = _committed(
            client, big, "step_succeeded", payload={"step": "fetch", "result": result}
        )
        _set_max_message_bytes(admin, env.topics.rejections, LOWERED_REJECTIONS_LIMIT)
        _wait_until_refused(env, env.topics.rejections, p, 4 * LOWERED_REJECTIONS_LIMIT)
        again = Proposal(
            proposal_id="poison-f",
            run_id=big,
            event="step_succeeded",
            payload={"step": "fetch", "result": result},
        )
        value = again.model_dump_json(exclude_none=True).encode()
        offset = raw.send(p, big.encode(), value, _signed(env, big.encode(), value))
        # its duplicate_step rejection echoes the stored result: ~20 KB, over the limit
        served += _follow_ups(client, worker, p, "f: broker refuses the outcome")
        outcome = _outcome_of(env, p, offset, "poison-f")
        assert isinstance(outcome, Rejection), f"[f] {outcome}"
        assert outcome.code is RejectionCode.DUPLICATE_STEP, f"[f] {outcome}"
        assert outcome.step_result is None and "left out" in outcome.detail, f"[f] {outcome}"
        log_text = _full_log(worker)
        assert "MSG_SIZE_TOO_LARGE" in log_text and "transaction aborted" in log_text, "[f]"
        assert "deciding again within them" in log_text, "[f] the limits were not read again"
        snapshot = worker.snapshot(big)
        assert snapshot is not None and snapshot.revision == before.revision, "[f] run moved"
        done = _committed(client, big, "complete")
        assert (done.to_state, done.revision) == ("done", before.revision + 1), f"[f] {done}"
        served.append(big)
        _assert_alive(worker, "f")

        # every run as the first worker serves it, and as the changelog has it
        expected: dict[str, RunSnapshot] = {}
        for run_id in served:
            snapshot = worker.snapshot(run_id)
            assert snapshot is not None, f"the first worker has no run {run_id}"
            expected[run_id] = snapshot
        changelog = published(env).snapshots
        assert {r: changelog.get(r) for r in served} == expected, "changelog differs"
        assert not [r for r in absent if r in changelog], f"created: {set(absent) & set(changelog)}"
        transitions = published(env).transitions
        assert not [t for t in transitions if t.run_id in absent], "a poison run committed"
        raw_keys = {
            m.key() for m in read_topics(KafkaSettings(env.bootstrap), [env.topics.changelog])
        }
        assert spoof.encode() not in raw_keys, "[d] a changelog record is keyed by the spoof"

        # a second worker, empty state dir, same group, takes over and serves the same
        _assert_alive(worker, "before the hand-over")
        assert worker.terminate() == 0, worker.log()
        second = _worker(env, "w2")
        second.wait_ready(partitions=PARTITIONS)
        for run_id, snapshot in expected.items():
            assert second.snapshot(run_id) == snapshot, f"second worker serves {run_id} differently"
        for run_id in absent:
            if "\u0000" not in run_id:
                assert second.snapshot(run_id) is None, f"second worker has run {run_id!r}"
        # and decides: a new proposal on a run of every partition
        for partition in range(PARTITIONS):
            run_id = _runs_on(partition, "after-takeover", 1)[0]
            _committed(
                client, run_id, "create", payload={"machine": "task_lifecycle", "options": {}}
            )
        _assert_alive(second, "second worker")
        assert second.terminate() == 0, second.log()
    finally:
        client.close()
        _stop(worker)
        _stop(second)


# -- 2. late approval -------------------------------------------------------------
def test_approval_produced_late_while_no_worker_ran_is_refused_deadline_passed(env: Env) -> None:
    run_id = "late-approval"
    worker: WorkerProcess | None = _worker(env, "w1")
    restarted: WorkerProcess | None = None
    client = env.client()
    approver = env.client("approver")  # the generated keyring's approver key
    try:
        assert worker is not None
        worker.wait_ready(partitions=PARTITIONS)
        client.waiter()
        _committed(
            client,
            run_id,
            "create",
            payload={
                "machine": "task_lifecycle",
                "options": {"deadlines": {"approval_timeout_ms": 3000}},
            },
        )
        _committed(client, run_id, "start")
        paused = _committed(client, run_id, "pause_for_approval")
        assert paused.to_state == "paused"
        snapshot = worker.snapshot(run_id)
        assert snapshot is not None
        (timer,) = [t for t in snapshot.timers if t.name == "approval"]
        due = timer.due_at_ms
        assert worker.terminate() == 0, worker.log()
        assert int(time.time() * 1000) < due, "the first worker stopped too late to test this"
        assert "deadline approval" not in _full_log(worker), "the first worker fired it"

        while int(time.time() * 1000) < due + 500:
            time.sleep(0.1)
        proposal_id = approver.propose(
            run_id, "approval_granted", payload=approval_payload(paused.revision)
        )
        approver.flush()

        restarted = _worker(env, "w1")
        restarted.wait_ready(partitions=PARTITIONS)
        try:
            late = client.wait(proposal_id, DECIDED_WITHIN_S)
        except OutcomeTimeout:
            pytest.fail(f"the late approval was not decided:\n{restarted.log()}")
        assert isinstance(late, Rejection), f"the late approval committed: {late}"
        assert late.code is RejectionCode.DEADLINE_PASSED, f"{late.code}: {late.detail}"
        assert late.at_ms >= due, late
        assert (late.state, late.revision) == ("paused", paused.revision), late

        def failed() -> list[Transition] | None:
            mine = sorted(
                (t for t in published(env).transitions if t.run_id == run_id),
                key=lambda t: t.revision,
            )
            return mine if mine and mine[-1].to_state == "failed" else None

        history = eventually(f"{run_id} failed", failed, DECIDED_WITHIN_S)
        last = history[-1]
        assert (last.event, last.reason, last.from_state, last.revision) == (
            "timeout",
            "approval_timeout",
            "paused",
            paused.revision + 1,
        ), last
        assert last.metadata.get("timer") == "approval" and last.principal.authority == "runtime"
        assert [t.revision for t in history] == list(range(len(history)))
        assert sum(1 for t in history if "timer" in t.metadata) == 1
        time.sleep(1.0)  # would it fire twice?
        health = restarted.health()
        assert health is not None and health["stats"]["deadlines_fired"] == 1, health
        final = restarted.snapshot(run_id)
        assert final is not None and (final.state, final.revision) == ("failed", last.revision)
        _assert_alive(restarted, "late approval")
        assert restarted.terminate() == 0, restarted.log()
    finally:
        client.close()
        approver.close()
        _stop(worker)
        _stop(restarted)
