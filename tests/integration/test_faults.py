"""The fault harness, short: every scenario on a real broker, every invariant exact;
on the 3-node cluster a partition leader's SIGKILL and a short soak. The full version
is `make faults` (python -m tests.faults) and `make soak`."""

import time
from pathlib import Path

import pytest

from processor.broker.cluster import Cluster as Brokers
from schemas import Proposal
from tests.faults.brokers import CLUSTER_SCENARIOS
from tests.faults.check import Row, check
from tests.faults.cluster import Cluster
from tests.faults.scenarios import PARTITIONS, SCENARIOS, SHORT, Size, broker_restart, fresh_env
from tests.faults.soak import plot, soak, table
from tests.integration.harness import Env, eventually, published, send, workload

#: The fault harness at CI size: minutes of kills and restarts (`make slow`, and CI).
pytestmark = pytest.mark.slow


def assert_clean(row: Row) -> None:
    assert row.lost == 0 and row.duplicated == 0 and row.mismatched == 0, row.describe()
    assert row.crashes == 0, row.describe()
    assert row.lag_zero, row.describe()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_loses_repeats_and_mismatches_nothing(
    name: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    row = SCENARIOS[name](kafka_bootstrap, tmp_path, "native", SHORT)
    assert_clean(row)
    assert row.faults == {"kills": SHORT.kills, "scaling": 2, "zombie": 1, "hostile": 0}[name]


def test_faust_runtime_under_kills_keeps_its_guarantee(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """At least once: repeats allowed (each the same outcome), nothing lost or different."""
    # Half the short feed: the Faust runtime is fed at a fifth of the native rate.
    size = Size(SHORT.runs // 2, SHORT.proposals // 2, SHORT.rate, 2, 0)
    row = SCENARIOS["kills"](kafka_bootstrap, tmp_path, "faust", size)
    assert_clean(row)


def test_broker_stop_and_start_mid_stream(launcher: None, tmp_path: Path) -> None:
    row = broker_restart(tmp_path, "native", SHORT)
    assert_clean(row)
    assert row.faults == 1
    # Recovery is read from the broker's return as well as from its stop. The broker is
    # away at least its 5 s down, and no answer comes in that time.
    (back,), (away,), (whole,) = row.after_return_s, row.away_s, row.recovery_s
    assert away > 5.0 and whole > 5.0 and back > 0.0


def test_a_partition_leader_killed_on_a_cluster(kafka_cluster: Brokers, tmp_path: Path) -> None:
    """Replication 3, min.insync.replicas 2: the leader of a proposals partition is
    SIGKILLed mid-stream and started again; nothing lost, repeated or different."""
    size = Size(runs=800, proposals=8_000, rate=600, kills=0, hostile=0)
    row = CLUSTER_SCENARIOS["leader"](kafka_cluster, tmp_path, "native", size)
    assert_clean(row)
    assert row.faults == 1 and len(row.recovery_s) == 1


def test_a_short_soak_on_a_cluster(kafka_cluster: Brokers, tmp_path: Path) -> None:
    """`make soak` in little: a minute at half the drain rate, workers SIGKILLed, a broker
    restarted; the invariants hold and the report and its plot are written."""
    report = soak(kafka_cluster, tmp_path / "soak", 1.0, kill_every_s=15, probe=6_000)
    assert_clean(report.row)
    assert [what for _, what in report.faults if "broker" in what], report.faults
    assert len([f for f in report.faults if "SIGKILL" in f[1]]) >= 2, report.faults
    assert report.samples and all(s.rss_mb for s in report.samples)
    assert "| lost |" in table(report)
    plot(report, tmp_path / "soak.png")
    assert (tmp_path / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _no_deadline_due_soon(env: Env) -> bool | None:
    horizon = int(time.time() * 1000) + 10_000
    due = [
        timer
        for snapshot in published(env).snapshots.values()
        for timer in snapshot.timers
        if timer.kind == "deadline" and timer.due_at_ms <= horizon
    ]
    return True if not due else None


def test_counted_with_the_workers_stopped_unread_proposals_are_pending(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """How the soak counts: with every worker stopped, a deadline proposal a runtime key
    signed (what the stopping workers' timers write last) is left for the next owner, not
    counted lost; any other unread proposal, a forged "timer:" id included, makes lag 0
    a no; what the workers did read is still held to every invariant."""
    env = fresh_env(kafka_bootstrap, tmp_path)
    workers = Cluster(env, "native")
    workers.start(0)
    plan = workload(runs=6, proposals=60, seed=3)
    send(env, plan)
    assert_clean(check(Row("stopped", "native", len(plan), 0), env, workers.live(), PARTITIONS))
    # The plan's retrying runs have retry deadlines a few seconds out: the workers fire
    # and decide them before they stop (a run's snapshot keeps a timer until its deadline
    # proposal is decided), so none is left unread.
    eventually("no deadline due within 10 s", lambda: _no_deadline_due_soon(env), 60)
    workers.close()
    assert_clean(row := check(Row("stopped", "native", len(plan), 0), env, [], PARTITIONS))
    assert row.pending_timers == 0

    run_id = plan[0]["run_id"]

    def unread(key_id: str, proposal_id: str) -> Row:
        # As a deadline is sent: the revision and the timer its id names.
        proposal = Proposal(
            proposal_id=proposal_id,
            run_id=run_id,
            event="run_failed",
            reason="timeout",
            expected_revision=1,
            metadata={"timer": proposal_id.rsplit(":", 1)[-1]},
        )
        _send_signed(env, key_id, proposal)
        return check(Row("stopped", "native", len(plan), 0), env, [], PARTITIONS, settle=0)

    row = unread("runtime", f"timer:{run_id}:1:deadline")
    assert (row.lost, row.mismatched, row.pending_timers, row.lag_zero) == (0, 0, 1, True), (
        row.describe()
    )
    row = unread("tool", f"timer:{run_id}:1:forged")
    assert (row.lost, row.mismatched, row.pending_timers, row.lag_zero) == (0, 0, 1, False), (
        row.describe()
    )
    assert any("unread proposal" in e for e in row.examples), row.describe()


def _send_signed(env: Env, key_id: str, proposal: Proposal) -> None:
    client = env.client(key_id)
    value = proposal.model_dump_json(exclude_none=True).encode()
    key = proposal.run_id.encode()
    client.send_raw(key, value, env.sign(key_id, key, value))
    client.flush(30)
    client.close()
