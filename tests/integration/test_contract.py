"""The contract against a hostile key holder, on the real broker, in both runtimes:
answered means answered (across a worker that restores from the changelog), approvals
bound to their pause, steps settled before success, ceilings on creator limits, a
scope that discloses nothing of runs outside it, and continuations the original agreed
to. One worker per runtime serves the
module; each test uses its own runs."""

import json
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from processor.client import RunstateClient, approval_payload
from processor.engine.continuation import UNDONE, relay_id
from processor.history.resume import continuation_payload
from processor.kafka.config import KafkaSettings
from processor.kafka.readback import read_partitions
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines
from processor.trust.keygen import generate_keyring
from processor.trust.keyring import load_keyring
from schemas.codes import RejectionCode
from schemas.messages import Rejection, RunSnapshot, Transition
from tests.integration.harness import Env, WorkerProcess, published, runstate

#: One process starts the module's workers once for every test here.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("contract")]

M = "task_lifecycle"
ANSWER_WITHIN_S = 30.0


@dataclass
class World:
    env: Env
    runtime: str
    worker: WorkerProcess
    workers: int = 1

    def client(self, key_id: str = "runtime") -> RunstateClient:
        return self.env.client(key_id)

    def snapshot(self, run_id: str) -> RunSnapshot:
        snapshot = self.worker.snapshot(run_id)
        assert snapshot is not None, run_id
        return snapshot

    def restart_empty(self) -> None:
        """Stop the worker; start another with an empty state directory, which restores
        every run (and what it answered) from the changelog."""
        assert self.worker.terminate() == 0, self.worker.log()
        self.workers += 1
        self.worker = WorkerProcess(
            self.env, self.env.tmp / f"w{self.workers}", runtime=self.runtime
        )
        self.worker.wait_ready(partitions=3)


@pytest.fixture(scope="module", params=["native", "faust"])
def world(
    request: pytest.FixtureRequest,
    kafka_bootstrap: str,
    admin: AdminClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    """The standard keys, plus an approver key with the runtime's own source (the asker
    deciding its own approval) and a runtime key scoped to runs under `team-a`."""
    runtime = str(request.param)
    topics = TopicNames.with_prefix(f"t-{uuid.uuid4().hex[:10]}.")
    create_topics(admin, plan_topics(topics, partitions=3, replication=1))
    tmp: Path = tmp_path_factory.mktemp(f"contract-{runtime}")
    data = generate_keyring().model_dump(mode="json", exclude_none=True)
    data["keys"]["runtime-approver"] = {
        "algorithm": "hmac-sha256",
        "secret": secrets.token_hex(32),
        "source": "runtime",
        "authority": "approver",
    }
    data["keys"]["team-a"] = {
        "algorithm": "hmac-sha256",
        "secret": secrets.token_hex(32),
        "source": "runtime:team-a",
        "authority": "runtime",
        "run_prefixes": ["team-a"],
    }
    path = tmp / "keyring.json"
    path.write_text(json.dumps(data))
    env = Env(kafka_bootstrap, topics, load_keyring(path, None), path, tmp)
    found = World(env, runtime, WorkerProcess(env, tmp / "w1", runtime=runtime))
    try:
        found.worker.wait_ready(partitions=3)
        yield found
    finally:
        assert found.worker.terminate() == 0, found.worker.log()


def _committed(client: RunstateClient, run_id: str, event: str, **kw: object) -> Transition:
    outcome = client.propose_and_wait(run_id, event, **kw)  # type: ignore[arg-type]
    assert isinstance(outcome, Transition), outcome
    return outcome


def _refused(
    client: RunstateClient, run_id: str, event: str, code: RejectionCode, **kw: object
) -> Rejection:
    outcome = client.propose_and_wait(run_id, event, **kw)  # type: ignore[arg-type]
    assert isinstance(outcome, Rejection), outcome
    assert outcome.code is code, f"{outcome.code}: {outcome.detail}"
    return outcome


def _started(world: World, run_id: str, machine: str = M, start: str = "start") -> None:
    runtime = world.client()
    try:
        _committed(runtime, run_id, "create", payload={"machine": machine, "options": {}})
        _committed(runtime, run_id, start)
    finally:
        runtime.close()


# -- answered means answered ----------------------------------------------------
def _captured(env: Env, proposal_id: str) -> tuple[bytes, bytes]:
    """(key, value) of the first record with `proposal_id` in the proposals topic."""
    for records in read_partitions(KafkaSettings(env.bootstrap), env.topics.proposals).values():
        for record in records:
            if record.value and json.loads(record.value).get("proposal_id") == proposal_id:
                assert record.key is not None
                return record.key, record.value
    raise AssertionError(f"{proposal_id} is not in the proposals topic")


def _answers(env: Env, proposal_id: str, count: int) -> tuple[list[Rejection], list[Transition]]:
    """The rejections and transitions answering `proposal_id`, once there are `count`."""
    deadline = time.monotonic() + ANSWER_WITHIN_S
    while True:
        found = published(env)
        refused = [r for r in found.rejections if r.proposal_id == proposal_id]
        committed = [t for t in found.transitions if t.proposal_id == proposal_id]
        if len(refused) + len(committed) >= count or time.monotonic() > deadline:
            assert len(refused) + len(committed) == count, (proposal_id, refused, committed)
            return refused, committed
        time.sleep(0.3)


def _resend(world: World, client: RunstateClient, key_id: str, proposal_id: str) -> None:
    """The proposal's very bytes again, signed again now by the key that signed them."""
    key, value = _captured(world.env, proposal_id)
    client.send_raw(key, value, world.env.sign(key_id, key, value))
    client.flush()


class Answers:
    """Counts what was sent under each proposal id, and reads back all its answers once
    each sending has one (in the run's partition's order: the newest last). Read from
    the topics, not a waiter: several answers share one proposal id here."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.sent: Counter[str] = Counter()

    def again(self, proposal_id: str) -> tuple[list[Rejection], list[Transition]]:
        """All answers to `proposal_id`, once the sending just made has one too."""
        self.sent[proposal_id] += 1
        return _answers(self.env, proposal_id, self.sent[proposal_id])


def test_answered_means_answered_across_a_restart_from_the_changelog(world: World) -> None:
    """A refusal is the run's answer to the proposal id for its life: sent again once the
    run stands where it would commit, the same bytes get the same rejection; other
    content under the id, or the same from another principal, is proposal_id_reused; a
    worker restored from the changelog answers the same. A commit sent again is a
    duplicate naming it."""
    runtime, other = world.client(), world.client("operator")
    answers = Answers(world.env)
    try:
        _started(world, "ans-rev")
        conflict = _refused(
            runtime,
            "ans-rev",
            "pause_for_approval",
            RejectionCode.REVISION_CONFLICT,
            expected_revision=2,
        )
        step = _committed(
            runtime,
            "ans-rev",
            "step_started",
            payload={"step": "probe", "idempotency_key": "ans-rev:probe"},
        )
        assert step.revision == 2  # where the refused proposal would now commit

        _started(world, "ans-edge")
        invalid = _refused(
            runtime, "ans-edge", "dependency_resolved", RejectionCode.INVALID_TRANSITION
        )
        _committed(runtime, "ans-edge", "block_on_dependency")  # where it would commit

        firsts = [conflict, invalid]
        for first in firsts:
            assert first.proposal_id is not None and first.content_digest is not None
            answers.sent[first.proposal_id] = 1
        answers.sent[step.proposal_id] = 1
        for attempt in (1, 2):  # before, then after the restart
            for first in firsts:
                pid, run_id, event = first.proposal_id or "", first.run_id or "", first.event
                _resend(world, runtime, "runtime", pid)
                refused, committed = answers.again(pid)
                assert committed == [], f"a refused proposal committed when sent again: {committed}"
                assert refused[-1] == first, (refused[-1], first)
                assert all(r == first for r in refused if r.code is first.code), refused
                runtime.propose(
                    run_id,
                    event or "",
                    proposal_id=pid,
                    expected_revision=2 if run_id == "ans-rev" else None,
                    metadata={"attempt": attempt},
                )
                runtime.flush()
                refused, _ = answers.again(pid)
                reused = refused[-1]
                assert reused.code is RejectionCode.PROPOSAL_ID_REUSED, reused
                assert (reused.state, reused.revision) == (None, None), reused
            # the same content from another principal under the id: reused too
            pid = invalid.proposal_id or ""
            other.propose("ans-edge", "dependency_resolved", proposal_id=pid)
            other.flush()
            refused, _ = answers.again(pid)
            assert refused[-1].code is RejectionCode.PROPOSAL_ID_REUSED, refused[-1]
            assert (refused[-1].state, refused[-1].revision) == (None, None), refused[-1]
            rev, edge = world.snapshot("ans-rev"), world.snapshot("ans-edge")
            assert (rev.state, rev.revision, edge.state) == ("running", 2, "blocked")
            # the commit's id sent again: a duplicate naming the transition it made
            _resend(world, runtime, "runtime", step.proposal_id)
            refused, committed = answers.again(step.proposal_id)
            assert committed == [step], committed
            assert [r.code for r in refused] == [RejectionCode.DUPLICATE] * attempt
            assert {r.original_transition_id for r in refused} == {step.transition_id}
            if attempt == 1:
                world.restart_empty()
    finally:
        runtime.close()
        other.close()


# -- bound approvals -------------------------------------------------------------
def test_an_approval_answers_its_own_pause_in_time_from_another_principal(world: World) -> None:
    runtime, approver = world.client(), world.client("approver")
    asker_approves = world.client("runtime-approver")
    try:
        _started(world, "bound-1")
        first = _committed(runtime, "bound-1", "pause_for_approval")
        _committed(
            approver, "bound-1", "approval_granted", payload=approval_payload(first.revision)
        )
        second = _committed(runtime, "bound-1", "pause_for_approval")
        assert second.revision > first.revision

        # A late grant for pause #1 does not approve pause #2.
        late = _refused(
            approver,
            "bound-1",
            "approval_granted",
            RejectionCode.APPROVAL_WRONG_PAUSE,
            payload=approval_payload(first.revision),
        )
        assert (late.state, late.revision) == ("paused", second.revision)
        # Expired before it reached the broker.
        _refused(
            approver,
            "bound-1",
            "approval_granted",
            RejectionCode.APPROVAL_EXPIRED,
            payload=approval_payload(second.revision, expires_in_ms=-1_000),
        )
        # The asker holding an approver key may not decide its own request.
        _refused(
            asker_approves,
            "bound-1",
            "approval_granted",
            RejectionCode.SELF_APPROVAL,
            payload=approval_payload(second.revision),
        )
        assert world.snapshot("bound-1").state == "paused"
        pause = world.snapshot("bound-1").pause
        assert pause is not None and pause.revision == second.revision
        assert pause.asked_by.source == "runtime"
        # The SDK's decision reads the pause from the run's snapshot.
        reading = RunstateClient(
            KafkaSettings(world.env.bootstrap),
            world.env.topics,
            signing_key=world.env.signing_key("approver"),
            worker_urls=[world.worker.url],
        )
        try:
            granted = reading.decide("bound-1")
        finally:
            reading.close()
        assert isinstance(granted, Transition) and granted.to_state == "running", granted
        assert granted.payload["pause"] == second.revision, granted.payload
    finally:
        for client in (runtime, approver, asker_approves):
            client.close()


def test_owned_run_the_runtime_cannot_take_a_run_back_out_of_its_approval_wait(
    world: World,
) -> None:
    """owned_run: the runtime asks, only an approver returns the run to running."""
    runtime, approver = world.client(), world.client("approver")
    try:
        _started(world, "own-1", machine="owned_run", start="run_started")
        asked = _committed(runtime, "own-1", "approval_requested")
        assert asked.to_state == "awaiting_approval"
        decision = approval_payload(asked.revision)
        _refused(runtime, "own-1", "approval_granted", RejectionCode.UNAUTHORIZED, payload=decision)
        _refused(runtime, "own-1", "run_resumed", RejectionCode.INVALID_TRANSITION)
        _refused(runtime, "own-1", "run_started", RejectionCode.INVALID_TRANSITION)
        _refused(runtime, "own-1", "run_completed", RejectionCode.INVALID_TRANSITION)
        snapshot = world.snapshot("own-1")
        assert (snapshot.state, snapshot.revision) == ("awaiting_approval", asked.revision)
        granted = approver.decide("own-1", pause=asked.revision)
        assert isinstance(granted, Transition) and granted.to_state == "running", granted
    finally:
        runtime.close()
        approver.close()


# -- steps settled -------------------------------------------------------------------
def test_an_executing_step_is_neither_started_again_nor_left_behind_by_success(
    world: World,
) -> None:
    runtime, other = world.client(), world.client("operator")
    refund = {"step": "refund", "idempotency_key": "steps-1:refund"}
    try:
        _started(world, "steps-1")
        _committed(runtime, "steps-1", "step_started", payload=refund)
        again = _refused(
            other, "steps-1", "step_started", RejectionCode.STEP_IN_PROGRESS, payload=refund
        )
        assert "refund" in again.detail
        _refused(runtime, "steps-1", "complete", RejectionCode.GUARD_FAILED)
        _committed(
            runtime, "steps-1", "step_succeeded", payload={"step": "refund", "result": {"ok": 1}}
        )
        done = _committed(runtime, "steps-1", "complete")
        assert done.to_state == "done"
    finally:
        runtime.close()
        other.close()


# -- ceilings and disclosure -----------------------------------------------------------
def test_ceilings_on_limits_and_a_scope_that_discloses_nothing(world: World) -> None:
    runtime, team_a = world.client(), world.client("team-a")
    try:
        greedy = _refused(
            runtime,
            "limits-1",
            "create",
            RejectionCode.LIMIT_EXCEEDED,
            payload={"machine": M, "options": {"max_retries": 10**6}},
        )
        assert "max_retries" in greedy.detail

        _started(world, "team-ab-7")
        # team-a's key reaches its own runs on a separator boundary ...
        for run_id in ("team-a-7", "team-a/7"):
            _committed(team_a, run_id, "create", payload={"machine": M, "options": {}})
        # ... and is refused on team-ab-7 without learning its state, revision or machine
        outside = _refused(team_a, "team-ab-7", "fatal_error", RejectionCode.UNAUTHORIZED)
        assert (outside.state, outside.revision) == (None, None), outside
        assert M not in outside.detail and "running" not in outside.detail, outside.detail
        assert world.snapshot("team-ab-7").state == "running"
    finally:
        runtime.close()
        team_a.close()


# -- continuations -------------------------------------------------------------------
def test_a_run_is_continued_once_as_its_original_agrees(world: World) -> None:
    """The original (another partition, most likely) checks the continuation through
    the workers' messages: a tampered claim and a second continuation are refused with
    the original's reason, a grant forged by an agent is refused, and the continuation
    taken is named by both runs, which `verify` checks again from the log."""
    runtime, team_a = world.client(), world.client("team-a")
    try:
        _started(world, "cont-1")
        refund = {"step": "refund", "idempotency_key": "cont-1:refund"}
        _committed(runtime, "cont-1", "step_started", payload=refund)
        _committed(runtime, "cont-1", "step_succeeded", payload={"step": "refund", "result": 7})
        _committed(runtime, "cont-1", "fatal_error")
        old = world.snapshot("cont-1")
        honest = continuation_payload(old, builtin_machines())

        claims_more = {**honest, "steps": {**honest["steps"], "wire": {"result": "sent"}}}
        tampered = _refused(
            runtime, "cont-2", "create", RejectionCode.CONTINUATION_REFUSED, payload=claims_more
        )
        assert "succeeded and executing steps" in tampered.detail
        # team-a's key does not reach cont-1: refused before anything is asked of it
        _refused(team_a, "team-a-cont", "create", RejectionCode.UNAUTHORIZED, payload=honest)
        forged = {
            "create": {
                "proposal_id": "p-forged",
                "run_id": "cont-3",
                "event": "create",
                "payload": claims_more,
            },
            "principal": {"source": "runtime", "authority": "runtime"},
        }
        _refused(
            runtime, "cont-3", "continuation_granted", RejectionCode.UNAUTHORIZED, payload=forged
        )

        created = _committed(runtime, "cont-4", "create", payload=honest)
        assert created.payload["continues"]["run_id"] == "cont-1"
        named = [t for t in published(world.env).transitions if t.run_id == "cont-1"][-1]
        assert named.event == "continued_by" and named.payload["run_id"] == "cont-4"
        assert world.snapshot("cont-1").continued_by == "cont-4"
        assert world.snapshot("cont-4").steps["refund"].result == 7
        assert "cont-3" not in {t.run_id for t in published(world.env).transitions}

        again = _refused(
            runtime,
            "cont-5",
            "create",
            RejectionCode.CONTINUATION_REFUSED,
            payload=continuation_payload(world.snapshot("cont-1"), builtin_machines()),
        )
        assert "continued by another run already" in again.detail

        # A run of the new id created while the original is asked (both records in one
        # batch, the plain create after): the continuation is refused run_exists, and
        # the original, told so, names none again and may be continued.
        _started(world, "race-1")
        _committed(runtime, "race-1", "fatal_error")
        carried = continuation_payload(world.snapshot("race-1"), builtin_machines())
        asking = runtime.propose("race-2", "create", payload=carried)
        plain = runtime.propose("race-2", "create", payload={"machine": M, "options": {}})
        runtime.flush()
        assert isinstance(runtime.wait(plain), Transition)
        raced = runtime.wait(asking)
        assert isinstance(raced, Rejection) and raced.code is RejectionCode.RUN_EXISTS, raced
        # The undo was sent with that refusal: its transition names the revision to carry.
        _, (undone,) = _answers(world.env, relay_id(UNDONE, "race-2", asking), 1)
        assert undone.event == UNDONE and undone.payload["run_id"] == "race-2"
        link = {"run_id": "race-1", "revision": undone.revision, "hash": undone.hash}
        _committed(runtime, "race-3", "create", payload={**carried, "continues": link})
        # The log proves it again: every decision here, both runs' chains and the link.
        verified = runstate(world.env, "verify", "--keyring-file", str(world.env.keyring_path))
        assert verified.returncode == 0, verified.stdout + verified.stderr
    finally:
        runtime.close()
        team_a.close()
