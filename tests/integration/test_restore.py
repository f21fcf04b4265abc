"""A restore runs beside the worker's loop, not inside the rebalance callback: however
long it takes, the worker keeps polling, so it keeps its place in the group, and it says
it is not ready until the restore is done."""

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from processor.kafka.partitioning import partition_for
from processor.kafka.topics import TopicNames
from processor.records.changelog_keys import INDEX_HEADER, snapshot_index
from schemas.messages import Transition
from tests.integration.harness import Env, WorkerProcess, make_env
from tests.unit.driver import Driver

#: The loop must poll at least this often (the worker's max.poll.interval.ms here).
MAX_POLL_MS = 2_500
RUNS = 300_000


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def _fill_changelog(env: Env) -> None:
    """RUNS snapshots spread over the changelog's partitions, as a worker writes them."""
    snapshot = Driver(run_id="RUN-ID").create("run_state").snapshot
    template = snapshot.model_dump_json()
    headers = [(INDEX_HEADER, snapshot_index(snapshot))]
    producer = Producer(
        {"bootstrap.servers": env.bootstrap, "linger.ms": 50, "compression.type": "lz4"}
    )
    for n in range(RUNS):
        run_id = f"r-{n}"  # in the partition the worker will look it up in
        value = template.replace("RUN-ID", run_id).encode()
        while True:
            try:
                producer.produce(
                    env.topics.changelog,
                    key=run_id.encode(),
                    value=value,
                    partition=partition_for(run_id, 3),
                    headers=headers,
                )
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_restore_longer_than_max_poll_interval_keeps_the_worker_in_its_group(
    env: Env,
) -> None:
    _fill_changelog(env)
    worker = WorkerProcess(
        env,
        env.tmp / "w1",
        "-X",
        "session.timeout.ms=2000",
        "-X",
        "heartbeat.interval.ms=500",
        "-X",
        f"max.poll.interval.ms={MAX_POLL_MS}",
    )
    try:
        began = time.monotonic()
        restoring_seen, idle_max, ready_at = 0, 0.0, None
        while time.monotonic() - began < 180:
            assert worker.proc.poll() is None, worker.log()
            try:
                status, body = _get(worker.url + "/readyz")
                _, live = _get(worker.url + "/livez")
            except OSError:  # the API is not up yet
                time.sleep(0.1)
                continue
            if status == 200:
                ready_at = time.monotonic()
                break
            assert status == 503 and body["ready"] is False and body["waiting"], body
            if any("restoring" in w for w in body["waiting"]):
                restoring_seen += 1
                idle_max = max(idle_max, live["loop_idle_seconds"])
            time.sleep(0.1)
        assert ready_at is not None, f"never ready:\n{worker.log()}"
        seconds = ready_at - began
        # The condition under test: the restore outlasted max.poll.interval.ms, and the
        # loop kept turning through it (a restore inside the callback held it).
        assert restoring_seen >= 3, f"seen restoring {restoring_seen} times in {seconds:.1f} s"
        assert seconds > MAX_POLL_MS / 1000, f"restore took {seconds:.1f} s: raise RUNS"
        assert idle_max < 1.0, f"the loop stood still for {idle_max} s while restoring"
        log = worker.log_path.read_text(errors="replace")
        # librdkafka reports a member that stopped polling as _MAX_POLL_EXCEEDED
        assert "MAX_POLL" not in log and "maximum poll interval" not in log, log[-3000:]
        assert log.count("assigned partitions") == 1, log[-3000:]  # one assignment only
        assert worker.get(worker.run_path("r-7")) is not None  # restored runs are served
        # and it decides
        client = env.client()
        assert isinstance(client.create_and_wait("after-restore", "run_state"), Transition)
        assert worker.proc.poll() is None
    finally:
        worker.terminate()
