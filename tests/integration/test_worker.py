"""The native worker on a real broker: exactly once, across stops, kills and restores."""

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from processor.kafka.partitioning import partition_for
from processor.kafka.topics import TopicNames
from processor.trust.keyring import SigningKey
from schemas.codes import RejectionCode
from schemas.messages import Proposal
from tests.integration.harness import (
    Env,
    WorkerProcess,
    assert_guarantee,
    assert_serves_changelog,
    eventually,
    make_env,
    published,
    send,
    wait_for_outcomes,
    workload,
)


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


@pytest.fixture(params=["native", "faust"])
def runtime(request: pytest.FixtureRequest) -> str:
    """The suite runs against both runtimes; each asserts its own stated guarantee."""
    return str(request.param)


def sized(runtime: str, runs: int, proposals: int) -> tuple[int, int]:
    """The Faust runtime drains slower than the native worker, and its test gets a fifth
    of the load."""
    return (runs, proposals) if runtime == "native" else (runs // 5, proposals // 5)


def test_10k_proposals_over_1k_runs(env: Env, runtime: str) -> None:
    runs, proposals = sized(runtime, 1_000, 10_000)
    plan = workload(runs=runs, proposals=proposals)
    worker = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    try:
        worker.wait_ready(partitions=3)
        send(env, plan)
        result = wait_for_outcomes(env, plan)
        assert_guarantee(env, plan, result, runtime)
        # the worker's HTTP API serves the same committed snapshots
        for run_id in list(result.snapshots)[:50]:
            assert worker.snapshot(run_id) == result.snapshots[run_id]
    finally:
        assert worker.terminate() == 0, worker.log()


@pytest.fixture(
    params=[
        pytest.param(("native", "sigterm"), id="native-sigterm"),
        pytest.param(("native", "sigkill"), id="native-sigkill"),
        pytest.param(("faust", "sigterm"), id="faust-sigterm"),
        pytest.param(("faust", "sigkill"), id="faust-sigkill"),
    ]
)
def stop(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


def test_worker_stopped_mid_stream_loses_and_repeats_nothing(
    env: Env, stop: tuple[str, str]
) -> None:
    runtime, how = stop
    # The whole load for either runtime: stopped once a fifth is answered, the rest must
    # still be to come, however fast it drains and however late the health poll sees it.
    plan = workload(runs=1_000, proposals=10_000, seed=11)
    state = env.tmp / "w1"
    worker = WorkerProcess(env, state, runtime=runtime)
    try:
        worker.wait_ready(partitions=3)
    except BaseException:
        worker.kill()
        raise
    send(env, plan)
    # stop it once it is well into the stream
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        health = worker.health()
        if health is not None and health["stats"]["proposals"] >= len(plan) // 5:
            break
        time.sleep(0.05)
    if how == "sigterm":
        worker.stop_cleanly()
    else:
        worker.kill()
    partial = published(env)
    assert len(partial.transitions) + len(partial.rejections) < len(plan), "stopped too late"
    again = WorkerProcess(env, state, runtime=runtime)
    try:
        again.wait_ready(partitions=3)
        result = wait_for_outcomes(env, plan)
        assert_guarantee(env, plan, result, runtime)
    finally:
        assert again.terminate() == 0, again.log()


def test_partitions_move_between_workers_mid_stream(env: Env, runtime: str) -> None:
    """A second worker joins under load (partitions move to it, restored from the
    changelog), then the first is killed (its partitions move back): the guarantee holds."""
    runs, proposals = sized(runtime, 600, 6_000)
    plan = workload(runs=runs, proposals=proposals, seed=23)
    first = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    second: WorkerProcess | None = None
    try:
        first.wait_ready(partitions=3)
        send(env, plan[: len(plan) // 2])
        second = WorkerProcess(env, env.tmp / "w2", runtime=runtime)
        second.wait_ready()
        send(env, plan[len(plan) // 2 :])
        first.kill()
        second.wait_ready(partitions=3)
        result = wait_for_outcomes(env, plan)
        assert_guarantee(env, plan, result, runtime)
    finally:
        first.kill()
        if second is not None:
            assert second.terminate() == 0, second.log()


def test_empty_state_dir_restores_from_the_changelog(env: Env, runtime: str) -> None:
    runs, proposals = sized(runtime, 300, 3_000)
    plan = workload(runs=runs, proposals=proposals, seed=5)
    first = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    try:
        first.wait_ready(partitions=3)
        send(env, plan)
        result = wait_for_outcomes(env, plan)
        served = {run_id: first.snapshot(run_id) for run_id in result.snapshots}
        before = {run_id: s for run_id, s in served.items() if s is not None}
        assert len(before) == len(served)
    finally:
        assert first.terminate() == 0
    shutil.rmtree(env.tmp / "w1")
    fresh = WorkerProcess(env, env.tmp / "w2", runtime=runtime)
    try:
        fresh.wait_ready(partitions=3)
        if runtime == "native":  # the Faust runtime does not count what it restored
            health = fresh.health()
            assert health is not None and health["stats"]["restored_records"] > 0
        # as the first worker served them, or (a retry deadline fired since) as the
        # changelog's newest
        after = assert_serves_changelog(fresh, env, before)
        # and it carries on from there
        client = env.client()
        run_id = next(iter(before))
        outcome = client.propose_and_wait(run_id, "no_such_event", timeout=30)
        assert outcome.revision == after[run_id].revision  # type: ignore[union-attr]
        client.close()
    finally:
        assert fresh.terminate() == 0, fresh.log()


def test_garbage_goes_to_the_dlq_while_good_records_flow(env: Env, runtime: str) -> None:
    worker = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    try:
        worker.wait_ready(partitions=3)
        client = env.client()
        garbage = [b"\x00\xff\xfe", b"not json at all", b"[1,2,3]", b'"a string"', b"{"]
        good = []
        for i, junk in enumerate(garbage):
            client.send_raw(f"junk-{i}".encode(), junk)
            good.append(client.create(f"good-{i}", "task_lifecycle"))
        client.flush()
        result = wait_for_outcomes(env, len(garbage) + len(good), timeout=60)
        assert result.dead_letters == len(garbage)
        assert {t.proposal_id for t in result.transitions} == set(good)
        client.close()
    finally:
        assert worker.terminate() == 0, worker.log()


def test_forged_unsigned_and_unauthorized(env: Env, runtime: str) -> None:
    worker = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    try:
        worker.wait_ready(partitions=3)
        runtime = env.client("runtime")
        assert runtime.create_and_wait("r1", "owned_run", timeout=30).to_state == "queued"  # type: ignore[union-attr]
        runtime.propose_and_wait("r1", "run_started", timeout=30)

        def raw(event: str, proposal_id: str) -> bytes:
            return (
                Proposal(proposal_id=proposal_id, run_id="r1", event=event)
                .model_dump_json(exclude_none=True)
                .encode()
            )

        unsigned = raw("run_cancelled", "unsigned")
        runtime.send_raw(b"r1", unsigned, headers=[])
        forged = raw("run_cancelled", "forged")
        runtime.send_raw(
            b"r1",
            forged,
            SigningKey.hmac("runtime", "x" * 64).headers(
                env.topics.proposals, b"r1", forged, int(time.time() * 1000)
            ),
        )
        tampered = raw("run_cancelled", "tampered")
        runtime.send_raw(
            b"r1",
            tampered,
            env.sign("runtime", b"r1", raw("run_started", "tampered")),
        )
        runtime.flush()
        for pid in ("unsigned", "forged", "tampered"):
            outcome = runtime.wait(pid, 30)
            assert outcome.code is RejectionCode.UNAUTHENTICATED, outcome  # type: ignore[union-attr]

        model = env.client("model")
        refused = model.propose_and_wait("r1", "run_completed", expected_revision=1, timeout=30)
        assert refused.code is RejectionCode.UNAUTHORIZED  # type: ignore[union-attr]
        # a model cannot smuggle authority into the payload either
        smuggled = json.dumps(
            {
                "proposal_id": "smuggle",
                "run_id": "r1",
                "event": "run_completed",
                "authority": "runtime",
            }
        ).encode()
        model.send_raw(b"r1", smuggled, env.sign("model", b"r1", smuggled))
        model.flush()
        assert model.wait("smuggle", 30).code is RejectionCode.SCHEMA_INVALID  # type: ignore[union-attr]
        assert worker.snapshot("r1").state == "running"  # type: ignore[union-attr]
        model.close()
        runtime.close()
    finally:
        assert worker.terminate() == 0, worker.log()


def test_worker_refuses_topics_that_do_not_fit(
    kafka_bootstrap: str, admin: object, tmp_path: Path
) -> None:
    import uuid

    from processor.kafka.topic_creation import create_topics
    from processor.kafka.topic_plans import plan_topics

    names = TopicNames.with_prefix(f"bad-{uuid.uuid4().hex[:8]}.")
    plans = plan_topics(names, partitions=3, replication=1)
    broken = [p if p.role != "changelog" else type(p)(p.name, p.role, 2, 1, {}) for p in plans]
    create_topics(admin, broken)  # type: ignore[arg-type]
    env = make_env(kafka_bootstrap, names, tmp_path)
    worker = WorkerProcess(env, tmp_path / "w")
    code = worker.wait(60)
    assert code != 0
    log = worker.log()
    assert "partitions is 2, expected 3" in log and "runstate topics create" in log
    assert "cleanup.policy is delete, expected compact" in log


def _one_run_per_partition(prefix: str, partitions: int = 3) -> list[str]:
    """A run id in each partition: `prefix-<n>` for the first n that lands there."""
    found = {partition_for(f"{prefix}-{n}", partitions): f"{prefix}-{n}" for n in range(60)}
    assert len(found) == partitions
    return [found[p] for p in range(partitions)]


def _answered_once_by_a_first_worker(
    env: Env, plan: list[dict[str, Any]]
) -> tuple[WorkerProcess, list[str]]:
    """A Faust worker (periodic commit off) that answered every proposal of `plan`
    exactly once, still running; and the plan's proposal ids."""
    first = WorkerProcess(env, env.tmp / "w1", *NEVER_COMMIT, runtime="faust")
    try:
        first.wait_ready(partitions=3)
        send(env, plan)
        answered = wait_for_outcomes(env, plan).outcome_counts()
        ids = [p["proposal_id"] for p in plan]
        assert all(answered[i] == 1 for i in ids)
    except BaseException:
        first.kill()
        raise
    return first, ids


def _answered_again_once_read(env: Env, ids: list[str]) -> dict[str, int]:
    """The proposals among `ids` not answered exactly once, after one new run in each
    partition is answered (then every record before it there has been looked at)."""
    client = env.client()
    for run_id in _one_run_per_partition("after"):
        client.create_and_wait(run_id, "task_lifecycle", timeout=60)
    client.close()
    counts = published(env).outcome_counts()
    return {i: counts[i] for i in ids if counts[i] != 1}


#: No periodic commit of proposal offsets.
NEVER_COMMIT = ("--commit-interval-ms", "3600000")


def _ending_in_ghosts(seed: int) -> list[dict[str, Any]]:
    """A workload, then in each partition a proposal refused for a run that does not
    exist: nothing in the changelog names it, only a committed offset covers it."""
    return workload(runs=12, proposals=120, seed=seed) + [
        {"run_id": run_id, "event": "start", "key": "runtime", "proposal_id": f"g-{run_id}"}
        for run_id in _one_run_per_partition("ghost")
    ]


def test_faust_commits_what_it_answered_when_it_stops(env: Env) -> None:
    """The Faust runtime, stopped gracefully, commits the offsets it answered: a worker
    that comes after it, with an empty state directory, decides none of them again,
    though the periodic commit never ran. The last proposal of each partition is refused
    for a run that does not exist, which leaves nothing in the changelog to learn it
    from: only the committed offset covers it."""
    first, ids = _answered_once_by_a_first_worker(env, _ending_in_ghosts(seed=33))
    first.stop_cleanly()
    second = WorkerProcess(env, env.tmp / "w2", *NEVER_COMMIT, runtime="faust")
    try:
        second.wait_ready(partitions=3)
        assert _answered_again_once_read(env, ids) == {}
    finally:
        assert second.terminate() == 0, second.log()


def test_faust_commits_what_it_answered_when_partitions_move(env: Env) -> None:
    """The Faust runtime commits the offsets it answered when a rebalance takes partitions
    from it: a worker that joins with an empty state directory decides none of them
    again, though the periodic commit never ran (each partition's last proposal is
    refused for a run that does not exist: only the committed offset covers it)."""
    first, ids = _answered_once_by_a_first_worker(env, _ending_in_ghosts(seed=35))
    second: WorkerProcess | None = None
    try:
        second = WorkerProcess(env, env.tmp / "w2", *NEVER_COMMIT, runtime="faust")
        joined = second
        eventually(
            "the joining worker owning a partition",
            lambda: (joined.health() or {}).get("partitions") or None,
            timeout=90.0,
        )
        assert _answered_again_once_read(env, ids) == {}
    finally:
        assert first.terminate() == 0, first.log()
        if second is not None:
            assert second.terminate() == 0, second.log()


def test_faust_answered_proposals_stay_answered_when_a_restart_recovers_nothing(
    env: Env,
) -> None:
    """The Faust runtime: a worker restarted on a state directory that already holds
    every changelog record (applied by its earlier process's recovery, so this recovery
    reads nothing) decides none of the answered proposals again, though no proposal
    offset was ever committed: its local mark learned them as they were applied."""
    first, ids = _answered_once_by_a_first_worker(env, workload(runs=30, proposals=300, seed=21))
    first.kill()
    # A second worker recovers every partition from the changelog, then dies...
    second = WorkerProcess(env, env.tmp / "w2", *NEVER_COMMIT, runtime="faust")
    try:
        second.wait_ready(partitions=3)
    finally:
        second.kill()
    # ...and comes back on its state directory: nothing left to recover.
    again = WorkerProcess(env, env.tmp / "w2", *NEVER_COMMIT, runtime="faust")
    try:
        again.wait_ready(partitions=3)
        assert _answered_again_once_read(env, ids) == {}
    finally:
        assert again.terminate() == 0, again.log()
