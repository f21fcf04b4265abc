"""GET /metrics of the Faust runtime: the native worker's metrics (WorkerMetrics), counted
once each outcome is acknowledged (tests/integration/test_observability.py's scenario)."""

import time
from pathlib import Path

import pytest

from processor.partitioning import partition_for
from processor.topics import TopicNames
from schemas.messages import Rejection, Transition
from tests.integration.harness import Env, WorkerProcess, make_env
from tests.integration.test_observability import SLOW, M, scrape


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def test_faust_metrics_count_exactly_what_a_known_scenario_did(env: Env) -> None:
    """The native test's scenario and counts, on the Faust runtime; then a worker with an
    empty state directory counts the same runs per state from the restored table."""
    worker = WorkerProcess(env, env.tmp / "w1", runtime="faust")
    runtime, approver = env.client(), env.client("approver")
    try:
        worker.wait_ready(partitions=3)
        for run_id in ("m1", "m2"):
            assert isinstance(
                runtime.create_and_wait(run_id, M, max_retries=2, deadlines=SLOW), Transition
            )
            assert isinstance(runtime.propose_and_wait(run_id, "start"), Transition)
        # m1: fails once, retries, then fails for good; a late start is refused
        for event in ("transient_error", "retry", "fatal_error"):
            assert isinstance(runtime.propose_and_wait("m1", event), Transition)
        refused = runtime.propose_and_wait("m1", "start")
        assert isinstance(refused, Rejection) and refused.code.value == "terminal_state"
        # m2: waits for approval and gets it; a second approval is an invalid transition
        assert isinstance(runtime.propose_and_wait("m2", "pause_for_approval"), Transition)
        assert isinstance(approver.propose_and_wait("m2", "approval_granted"), Transition)
        refused = approver.propose_and_wait("m2", "approval_granted")
        assert isinstance(refused, Rejection) and refused.code.value == "invalid_transition"
        # and one record that is not a proposal at all
        runtime.send_raw(b"m3", b"not json")
        runtime.flush()
        got: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for _ in range(50):  # the DLQ record's checkpoint may trail the last answer
            got = scrape(worker)
            if got.get(("runstate_dead_letters_total", frozenset())) == 1:
                break
            time.sleep(0.2)
    finally:
        runtime.close()
        approver.close()
        assert worker.terminate() == 0, worker.log()

    def sample(name: str, **labels: str) -> float | None:
        return got.get((name, frozenset(labels.items())))

    transitions = {
        key: value for key, value in got.items() if key[0] == "runstate_transitions_total"
    }
    expected = {
        ("", "planned", "create"): 2,
        ("planned", "running", "start"): 2,
        ("running", "retrying", "transient_error"): 1,
        ("retrying", "running", "retry"): 1,
        ("running", "failed", "fatal_error"): 1,
        ("running", "paused", "pause_for_approval"): 1,
        ("paused", "running", "approval_granted"): 1,
    }
    assert transitions == {
        (
            "runstate_transitions_total",
            frozenset({"machine": M, "from_state": f, "to_state": t, "event": e}.items()),
        ): n
        for (f, t, e), n in expected.items()
    }
    assert sample("runstate_rejections_total", machine=M, event="start", code="terminal_state") == 1
    assert (
        sample(
            "runstate_rejections_total",
            machine=M,
            event="approval_granted",
            code="invalid_transition",
        )
        == 1
    )
    assert (
        sample(
            "runstate_invalid_transition_attempts_total",
            machine=M,
            state="running",
            event="approval_granted",
        )
        == 1
    )
    assert sample("runstate_dead_letters_total") == 1
    assert sample("runstate_retries_total", machine=M) == 1
    assert sample("runstate_recovery_seconds_count", machine=M, state="retrying") == 1
    assert sample("runstate_recovery_seconds_count", machine=M, state="paused") == 1
    assert (
        sample("runstate_time_in_state_seconds_count", machine=M, state="running") == 3
    )  # m1 twice, m2 once
    assert sample("runstate_runs", machine=M, state="failed") == 1
    assert sample("runstate_runs", machine=M, state="running") == 1
    assert sample("runstate_runs", machine=M, state="planned") == 0
    assert sample("runstate_runs", machine="run_state", state="pending") == 0
    assert sample("runstate_decision_seconds_count") == 12  # 11 proposals and the DLQ record
    assert sample("runstate_aborts_total") == 0  # no transactions in this runtime
    assert sample("runstate_restore_in_progress") == 0
    # aiokafka knows a partition's end once a fetch returned records of it: lag is reported
    # for the partitions that had proposals, and 0 there
    for run_id in ("m1", "m2", "m3"):
        partition = partition_for(run_id, 3)
        assert sample("runstate_consumer_lag", partition=str(partition)) == 0
    assert sample("runstate_checkpoint_records_count") == 12  # one per proposal delivered

    again = WorkerProcess(env, env.tmp / "w2", runtime="faust")
    try:
        again.wait_ready(partitions=3)
        for _ in range(50):  # counted by the first timer tick after the recovery
            got = scrape(again)
            if sample("runstate_runs", machine=M, state="failed") == 1:
                break
            time.sleep(0.2)
    finally:
        assert again.terminate() == 0, again.log()
    assert sample("runstate_runs", machine=M, state="failed") == 1
    assert sample("runstate_runs", machine=M, state="running") == 1
    assert (
        sample(
            "runstate_transitions_total",
            machine=M,
            from_state="",
            to_state="planned",
            event="create",
        )
        is None
    )
    restored = sample("runstate_restored_records_total")
    assert restored is not None and restored >= 2  # the changelog's snapshots of m1, m2
