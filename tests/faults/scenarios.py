"""The fault scenarios. Each feeds a workload under load, injects its faults, then counts
the invariants (`check`). `Size` scales them: a short version for CI, the full one for
`python -m tests.faults`."""

import random
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from processor.broker.launcher import start_broker
from processor.broker.server import tail
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames
from tests.faults.arrivals import Arrivals, first_answers_after, recovery_seconds
from tests.faults.check import Row, check
from tests.faults.cluster import Cluster, Feeder, signed_records
from tests.faults.hostile import hostile_records, mix
from tests.integration.harness import Env, make_env, workload

PARTITIONS = 3


@dataclass(frozen=True)
class Size:
    runs: int
    proposals: int
    rate: float  # proposals per second offered
    kills: int
    hostile: int


SHORT = Size(runs=600, proposals=6_000, rate=600, kills=3, hostile=1_500)
FULL = Size(runs=10_000, proposals=100_000, rate=1_000, kills=24, hostile=10_000)


def fresh_env(bootstrap: str, tmp: Path, replication: int = 1) -> Env:
    names = TopicNames.with_prefix(f"f-{uuid.uuid4().hex[:10]}.")
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    create_topics(admin, plan_topics(names, partitions=PARTITIONS, replication=replication))
    tmp.mkdir(parents=True, exist_ok=True)
    return make_env(bootstrap, names, tmp)


def _cluster(
    bootstrap: str, tmp: Path, runtime: str, workers: int, *extra: str
) -> tuple[Env, Cluster]:
    """Fresh topics and `workers` started workers of one group."""
    env = fresh_env(bootstrap, tmp)
    cluster = Cluster(env, runtime, *extra)
    for slot in range(workers):
        cluster.start(slot)
    return env, cluster


def run_scenario(
    name: str,
    env: Env,
    runtime: str,
    size: Size,
    cluster: Cluster,
    faults: Callable[[Feeder, Cluster, random.Random], list[float]],
    *,
    hostile: bool = False,
    returns: list[float] | None = None,
) -> Row:
    """`returns`: where `faults` takes a broker away, it appends the times the broker
    answered again, and the row gets the recovery from each return as well."""
    rng = random.Random(name)
    plan = workload(runs=size.runs, proposals=size.proposals, seed=rng.randint(0, 999))
    records = signed_records(env, plan)
    if hostile:
        run_ids = sorted({str(p["run_id"]) for p in plan})
        records = mix(
            records,
            hostile_records(run_ids, records, size.hostile, env.keyring, env.topics.proposals),
        )
    rate = size.rate if runtime == "native" else size.rate / 5
    feeder = Feeder(env, records, rate)
    arrivals = Arrivals(env)
    started = time.monotonic()
    row = Row(name, runtime, len(records), 0)
    try:
        cluster.wait_owned(PARTITIONS)
        arrivals.begin()
        feeder.start()
        fault_times = faults(feeder, cluster, rng)
        feeder.join()
        if feeder.error is not None:
            raise feeder.error
        cluster.note_crashes()
        row.faults = len(fault_times)
        cluster.wait_owned(PARTITIONS)
        check(row, env, cluster.live(), PARTITIONS)
        cluster.note_crashes()
        arrivals.end()
        if arrivals.error is not None:
            raise arrivals.error
        # Stalls that began in the feed's last half second are the feed ending.
        until = feeder.last_sent - 0.5
        row.recovery_s = recovery_seconds(fault_times, arrivals.times, until)
        if returns:
            row.after_return_s = first_answers_after(returns, arrivals.times)
            row.away_s = [round(b - a, 2) for a, b in zip(fault_times, returns, strict=True)]
    finally:
        arrivals.end()
        cluster.close()
        row.crashes = len(cluster.crashes)
        row.self_restarts = cluster.self_restarts()
        # what crashed (the first line), then the end of why
        row.examples += [
            c if len(c) < 2500 else f"{c[:200]}\n...\n{c[-2000:]}" for c in cluster.crashes[:2]
        ]
        row.seconds = round(time.monotonic() - started, 1)
    return row


def _spread(feeder: Feeder, n: int, rng: random.Random) -> list[float]:
    """`n` random moments (seconds from now) within the feed, one per equal slice."""
    span = feeder.seconds / n
    return [span * i + rng.uniform(0.2, 0.8) * span for i in range(n)]


def sleep_until(start: float, offset: float) -> None:
    time.sleep(max(0.0, start + offset - time.monotonic()))


def kills(bootstrap: str, tmp: Path, runtime: str, size: Size) -> Row:
    """Three workers (static membership, restarted in place); SIGKILL a random one at
    random moments, `size.kills` times."""
    env, cluster = _cluster(bootstrap, tmp, runtime, 3, "--static-membership")

    def faults(feeder: Feeder, cluster: Cluster, rng: random.Random) -> list[float]:
        start, times = time.monotonic(), []
        for moment in _spread(feeder, size.kills, rng):
            sleep_until(start, moment)
            slot = cluster.random_slot(rng)
            times.append(time.time())
            cluster.restart(slot)
        return times

    return run_scenario("SIGKILL a random worker", env, runtime, size, cluster, faults)


def scaling(bootstrap: str, tmp: Path, runtime: str, size: Size) -> Row:
    """One worker, then three, then one again, under load (graceful joins and leaves)."""
    env, cluster = _cluster(bootstrap, tmp, runtime, 1)

    def faults(feeder: Feeder, cluster: Cluster, rng: random.Random) -> list[float]:
        start = time.monotonic()
        sleep_until(start, feeder.seconds / 3)
        times = [time.time()]
        cluster.start(1)
        cluster.start(2)
        sleep_until(start, 2 * feeder.seconds / 3)
        times.append(time.time())
        cluster.stop(1)
        cluster.stop(2)
        return times

    return run_scenario("scale 1 -> 3 -> 1", env, runtime, size, cluster, faults)


def zombie(bootstrap: str, tmp: Path, runtime: str, size: Size) -> Row:
    """Three workers; one paused (SIGSTOP) past its session timeout, its partitions
    move, then it resumes (SIGCONT) and must be fenced, not publish."""
    env, cluster = _cluster(bootstrap, tmp, runtime, 3)

    def faults(feeder: Feeder, cluster: Cluster, rng: random.Random) -> list[float]:
        start = time.monotonic()
        sleep_until(start, feeder.seconds / 4)
        slot = cluster.random_slot(rng)
        times = [time.time()]
        cluster.pause(slot)
        time.sleep(12.0)  # session timeout 6 s, transaction timeout 10 s
        cluster.resume(slot)
        return times

    return run_scenario(
        "zombie (SIGSTOP past session timeout)", env, runtime, size, cluster, faults
    )


def hostile(bootstrap: str, tmp: Path, runtime: str, size: Size) -> Row:
    """Two workers; `size.hostile` hostile records of every kind mixed into the workload."""
    env, cluster = _cluster(bootstrap, tmp, runtime, 2)

    def faults(feeder: Feeder, cluster: Cluster, rng: random.Random) -> list[float]:
        return []

    return run_scenario("hostile input", env, runtime, size, cluster, faults, hostile=True)


def broker_restart(tmp: Path, runtime: str, size: Size) -> Row:
    """Its own broker, stopped mid-stream for 5 s and started again on the same data."""
    data = tmp / "broker"
    broker = start_broker(data)
    try:
        env, cluster = _cluster(broker.bootstrap, tmp / "env", runtime, 2)

        returns: list[float] = []

        def faults(feeder: Feeder, cluster: Cluster, rng: random.Random) -> list[float]:
            nonlocal broker
            start = time.monotonic()
            sleep_until(start, feeder.seconds / 3)
            times = [time.time()]
            broker.stop()
            time.sleep(5.0)
            broker = start_broker(data)  # returns once the broker answers
            returns.append(time.time())
            return times

        try:
            return run_scenario(
                "broker stop and start", env, runtime, size, cluster, faults, returns=returns
            )
        except Exception as exc:
            # The broker's own account goes with the failure: its data (and log) is
            # deleted below.
            raise AssertionError(
                f"{exc!r}; the broker (pid {broker.pid}) is "
                f"{'running' if broker.alive() else 'gone'}; its log ends with:\n"
                f"{tail(Path(broker.log_path), 60)}"
            ) from exc
    finally:
        broker.stop()
        shutil.rmtree(data, ignore_errors=True)


SCENARIOS = {
    "kills": kills,
    "scaling": scaling,
    "zombie": zombie,
    "hostile": hostile,
}
