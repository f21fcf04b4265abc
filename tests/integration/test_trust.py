"""Trust on the real broker: Ed25519 keys managed with `runstate keys`, a worker and an
auditor holding public keys only, replay, scope and revocation."""

import json
import random
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Producer

from processor.client import RunstateClient
from processor.history.audit import verify_partition
from processor.kafka.config import KafkaSettings
from processor.kafka.readback import read_partitions
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines
from processor.trust.keyring import load_keyring, load_signing_key
from processor.trust.signatures import Algorithm
from schemas.codes import RejectionCode
from schemas.messages import Rejection, Transition
from tests.integration.harness import ROOT, Env, WorkerProcess, eventually, published, runstate

pytestmark = pytest.mark.integration

M = "task_lifecycle"
MAX_AGE_MS = 4_000  # the test's freshness window: a replay only has to wait this long


def keys(*args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "processor.cli.main", "keys", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    """An Ed25519 keyring written by `runstate keys add`: the worker's timer key, an
    agent, a team-a approver limited to team-a's task runs, and an approver for all."""
    ring = tmp_path / "ring.json"
    for key_id, source, authority, *limits in [
        ("timer", "runtime", "runtime"),
        ("agent", "agent:builder", "runtime"),
        ("approver-a", "approver:team-a", "approver", "--run-prefix", "team-a/", "--machine", M),
        ("approver-all", "approver:oncall", "approver"),
    ]:
        keys(
            "add", key_id, "--keyring-file", str(ring), "--source", source,
            "--authority", authority, "--private-key-out", str(tmp_path / f"{key_id}.key.json"),
            "--effective-in-ms", "0", *limits,
        )  # fmt: skip
    data = json.loads(ring.read_text())
    data["signature_max_age_ms"] = MAX_AGE_MS
    ring.write_text(json.dumps(data))
    keyring = load_keyring(ring, None)
    assert all(e.algorithm is Algorithm.ED25519 and e.secret is None for e in keyring.keys.values())
    return Env(kafka_bootstrap, topic_names, keyring, ring, tmp_path)


def _client(env: Env, key_id: str) -> RunstateClient:
    signing = load_signing_key(env.tmp / f"{key_id}.key.json")
    return RunstateClient(KafkaSettings(env.bootstrap), env.topics, signing_key=signing)


def test_replay_scope_revocation_and_an_auditor_with_public_keys_only(env: Env) -> None:
    worker = WorkerProcess(env, env.tmp / "w1", "--timer-key-file", str(env.tmp / "timer.key.json"))
    agent, team_a, everyone = (_client(env, k) for k in ("agent", "approver-a", "approver-all"))
    try:
        worker.wait_ready(partitions=3)
        for run_id in ("team-a/r1", "team-b/r1", "team-b/r2"):
            assert isinstance(agent.create_and_wait(run_id, M), Transition)
            assert isinstance(agent.propose_and_wait(run_id, "start"), Transition)

        # An approval sent too early is refused; captured and sent again once the run
        # waits for it, it is refused as stale, never committed.
        early = team_a.decide("team-a/r1", pause=2)
        assert isinstance(early, Rejection) and early.code is RejectionCode.INVALID_TRANSITION
        captured = _captured(env, early.proposal_id or "")
        paused = agent.propose_and_wait("team-a/r1", "pause_for_approval")
        assert isinstance(paused, Transition) and paused.revision == 2
        time.sleep(MAX_AGE_MS / 1000 + 0.5)
        replayer = Producer(KafkaSettings(env.bootstrap).client({"partitioner": "murmur2_random"}))
        replayer.produce(env.topics.proposals, captured[1], captured[0], headers=captured[2])
        assert replayer.flush(30) == 0
        replayed = _second_answer(env, early.proposal_id or "")
        assert replayed.code is RejectionCode.STALE_SIGNATURE, replayed
        assert worker.snapshot("team-a/r1").state == "paused"  # type: ignore[union-attr]

        # Scope: team-a's approver is refused on team-b's run, accepted on its own.
        b_paused = agent.propose_and_wait("team-b/r1", "pause_for_approval")
        assert isinstance(b_paused, Transition)
        other_team = team_a.decide("team-b/r1", pause=b_paused.revision)
        assert isinstance(other_team, Rejection) and other_team.code is RejectionCode.UNAUTHORIZED
        assert "team-a/" in other_team.detail
        assert isinstance(team_a.decide("team-a/r1", pause=paused.revision), Transition)

        # Revocation: the worker reads the keyring again; from the revocation on the
        # key is refused, and what it signed before still verifies (below).
        approved = everyone.decide("team-b/r1", pause=b_paused.revision)
        assert isinstance(approved, Transition) and approved.principal.source == "approver:oncall"
        r2_paused = agent.propose_and_wait("team-b/r2", "pause_for_approval")
        assert isinstance(r2_paused, Transition)
        reloads = _reloads(worker)
        keys(
            "revoke",
            "approver-all",
            "--keyring-file",
            str(env.keyring_path),
            "--effective-in-ms",
            "0",
        )
        eventually("the worker reads the keyring again", lambda: _reloads(worker) > reloads or None)
        revoked = everyone.decide("team-b/r2", pause=r2_paused.revision)
        assert isinstance(revoked, Rejection), revoked
        assert revoked.code is RejectionCode.UNAUTHENTICATED and "revoked" in revoked.detail
    finally:
        for client in (agent, team_a, everyone):
            client.close()
        assert worker.terminate() == 0, worker.log()

    # The auditor holds the keyring of public keys only: it cannot sign, and verifies.
    verified = runstate(env, "verify", "--keyring-file", str(env.keyring_path))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    _one_changed_byte_is_found(env)


def _reloads(worker: WorkerProcess) -> int:
    """How often the worker has read its keyring file again (its log says each time)."""
    return worker.log_path.read_text(errors="replace").count("keyring reloaded from")


def _second_answer(env: Env, proposal_id: str) -> Rejection:
    """The rejection of the second record with `proposal_id` (the client's waiter
    answers with the first)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answers = [r for r in published(env).rejections if r.proposal_id == proposal_id]
        if len(answers) >= 2:
            return answers[1]
        time.sleep(0.5)
    raise AssertionError(f"no second answer for {proposal_id}")


def _captured(env: Env, proposal_id: str) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """(key, value, headers) of a proposal as it sits in the proposals topic."""
    for records in read_partitions(KafkaSettings(env.bootstrap), env.topics.proposals).values():
        for record in records:
            if record.value and json.loads(record.value).get("proposal_id") == proposal_id:
                assert record.key is not None
                return record.key, record.value, list(record.headers or [])  # type: ignore[arg-type]
    raise AssertionError(f"{proposal_id} is not in the proposals topic")


def _one_changed_byte_is_found(env: Env) -> None:
    """`verify`'s own check over the same records, with one byte of one transition
    changed (anywhere, at random): always found."""
    settings = KafkaSettings(env.bootstrap)
    proposals = read_partitions(settings, env.topics.proposals)
    transitions = read_partitions(settings, env.topics.transitions)
    keyring = load_keyring(env.keyring_path, None)
    machines = builtin_machines()
    rng = random.Random(16)
    for _ in range(20):
        partition = rng.choice(sorted(transitions))
        records = list(transitions[partition])
        n = rng.randrange(len(records))
        value = bytearray(records[n].value or b"")
        at = rng.randrange(len(value))
        value[at] = (value[at] + rng.randrange(1, 255)) % 256
        records[n] = replace(records[n], value=bytes(value))
        findings = verify_partition(
            partition,
            proposals.get(partition, []),
            records,
            topic=env.topics.proposals,
            machines=machines,
            keyring=keyring,
            partitions=3,
        )
        assert findings, f"byte {at} of transition {n} in partition {partition} changed unseen"
