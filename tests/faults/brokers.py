"""Fault scenarios on a three-node cluster (replication factor 3, `min.insync.replicas`
2): the everyday faults of production Kafka, each under load, each checked for the
same invariants as the single-broker scenarios. One node at a time is hurt, so the
cluster keeps a majority and every acknowledged write keeps two copies."""

import random
import time
from collections.abc import Callable
from pathlib import Path

from processor.broker.cluster import Cluster as Brokers
from tests.faults.check import Row
from tests.faults.cluster import Cluster, Feeder
from tests.faults.scenarios import Size, fresh_env, run_scenario, sleep_until

#: Long enough that a node is down, back and caught up while proposals still flow.
CLUSTER_SIZE = Size(runs=2_000, proposals=24_000, rate=600, kills=0, hostile=0)
#: How long a killed node stays down before it is started again.
DOWN_S = 8.0
#: A paused node is frozen past its broker session (broker.session.timeout.ms, 3 s in the
#: server template: the controller fences it) and its clients' request timeouts.
PAUSE_S = 15.0
REPLICATION = 3

#: Picks the node to hurt: (brokers, env's workers) -> node id.
Victim = Callable[[Brokers, Cluster], int]


def _proposals_leader(brokers: Brokers, workers: Cluster) -> int:
    return brokers.leader_of(workers.env.topics.proposals, 0)


def _changelog_leader(brokers: Brokers, workers: Cluster) -> int:
    return brokers.leader_of(workers.env.topics.changelog, 1)


def _transaction_coordinator(brokers: Brokers, workers: Cluster) -> int:
    return brokers.transaction_coordinator(workers.transactional_id(min(workers.workers)))


def _group_coordinator(brokers: Brokers, workers: Cluster) -> int:
    return brokers.group_coordinator(workers.env.group_id)


def _any(brokers: Brokers, workers: Cluster) -> int:
    return random.Random(workers.env.group_id).choice(brokers.node_ids)


#: What is done to the cluster while the feed runs: (feeder, brokers, workers) -> the
#: wall-clock times of the faults.
Fault = Callable[[Feeder, Brokers, Cluster], list[float]]
Scenario = Callable[[Brokers, Path, str, Size], Row]


def _scenario(name: str, fault: Fault) -> Scenario:
    """Fresh replicated topics, two workers, the workload fed while `fault` runs."""

    def scenario(brokers: Brokers, tmp: Path, runtime: str, size: Size) -> Row:
        env = fresh_env(brokers.bootstrap, tmp, replication=REPLICATION)
        # The worker's own session timeout (10 s), not the 6 s the single-broker scenarios
        # use to fail over from a killed worker fast: no worker is killed here, and a group
        # coordinator's move takes the cluster longer than 6 s to settle.
        workers = Cluster(env, runtime, "-X", "session.timeout.ms=10000")
        for slot in range(2):
            workers.start(slot)
        try:
            return run_scenario(
                name, env, runtime, size, workers, lambda feeder, w, _: fault(feeder, brokers, w)
            )
        finally:
            # Whatever the fault left down comes back for the next scenario.
            for node in brokers.node_ids:
                if not brokers.alive(node):
                    brokers.start(node)
            brokers.wait_in_sync(timeout=180)

    return scenario


def _hurt(
    victim: Victim,
    hurt: Callable[[Brokers, int], None],
    heal: Callable[[Brokers, int], None],
    for_s: float,
) -> Fault:
    """A third into the feed, `hurt` the node `victim` picks; `heal` it `for_s` later."""

    def fault(feeder: Feeder, brokers: Brokers, workers: Cluster) -> list[float]:
        sleep_until(time.monotonic(), feeder.seconds / 3)
        node = victim(brokers, workers)
        times = [time.time()]
        hurt(brokers, node)
        time.sleep(for_s)
        heal(brokers, node)
        return times

    return fault


def _kill(victim: Victim) -> Fault:
    """SIGKILL the node `victim` picks; start it again DOWN_S later (its data intact) and
    let it catch up."""
    return _hurt(victim, Brokers.kill, Brokers.start, DOWN_S)


def _rolling_restart(feeder: Feeder, brokers: Brokers, workers: Cluster) -> list[float]:
    """Every node in turn: stopped (a controlled shutdown), started, caught up; the next
    only once the last is back in every ISR, as an operator upgrades a cluster."""
    sleep_until(time.monotonic(), feeder.seconds / 6)
    times = []
    for node in brokers.node_ids:
        times.append(time.time())
        brokers.stop(node)
        brokers.start(node)
        brokers.wait_in_sync(node, timeout=120)
    return times


#: A node frozen (SIGSTOP) past its session, as a long GC pause or a frozen VM, then
#: resumed (SIGCONT): fenced meanwhile, it must rejoin without serving stale data.
_pause = _hurt(_proposals_leader, Brokers.pause, Brokers.resume, PAUSE_S)


def _lost_disk(feeder: Feeder, brokers: Brokers, workers: Cluster) -> list[float]:
    """A node killed and started again with an empty data directory (a disk lost): it
    must catch up from the others, and no acknowledged record may go missing."""
    sleep_until(time.monotonic(), feeder.seconds / 3)
    node = _any(brokers, workers)
    times = [time.time()]
    brokers.wipe_and_start(node)
    return times


#: Each scenario's key (`--scenario`), its row's name and its fault.
_FAULTS: dict[str, tuple[str, Fault]] = {
    "leader": ("SIGKILL a proposals leader", _kill(_proposals_leader)),
    "changelog-leader": ("SIGKILL a changelog leader", _kill(_changelog_leader)),
    "txn-coordinator": ("SIGKILL a transaction coordinator", _kill(_transaction_coordinator)),
    "group-coordinator": ("SIGKILL the group coordinator", _kill(_group_coordinator)),
    "rolling": ("rolling restart of 3 brokers", _rolling_restart),
    "pause": ("SIGSTOP a broker past its session", _pause),
    "lost-disk": ("broker restarted with its disk lost", _lost_disk),
}
CLUSTER_SCENARIOS: dict[str, Scenario] = {
    key: _scenario(name, fault) for key, (name, fault) in _FAULTS.items()
}
#: The scenarios' row names, for the report's recovery bounds.
CLUSTER_NAMES = {name for name, _ in _FAULTS.values()}
