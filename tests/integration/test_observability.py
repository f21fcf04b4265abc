"""What operators see: GET /metrics after a known scenario, the JSON logs, runs by
state across workers (which ask each other with their HTTP token), the probes."""

import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from processor.broker.server import free_ports
from processor.client import RunstateClient
from processor.kafka.config import KafkaSettings
from processor.kafka.partitioning import partition_for
from processor.kafka.topics import TopicNames
from schemas.messages import Rejection, Transition
from tests.integration.harness import Env, WorkerProcess, eventually, make_env

M = "task_lifecycle"
SLOW = {
    "approval_timeout_ms": 600_000,
    "heartbeat_timeout_ms": 600_000,
    "retry_backoff_ms": 600_000,
}


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def scrape(worker: WorkerProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(worker.url + "/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.parametrize("runtime", ["native", "faust"])
def test_metrics_count_exactly_what_a_known_scenario_did(env: Env, runtime: str) -> None:
    """The same counts from either runtime (the Faust runtime counts an outcome once its
    records are acknowledged); for Faust, a worker with an empty state directory then
    counts the same runs per state from the restored table."""
    worker = WorkerProcess(env, env.tmp / "w1", runtime=runtime)
    agent, approver = env.client(), env.client("approver")
    try:
        worker.wait_ready(partitions=3)
        for run_id in ("m1", "m2"):
            assert isinstance(
                agent.create_and_wait(run_id, M, max_retries=2, deadlines=SLOW), Transition
            )
            assert isinstance(agent.propose_and_wait(run_id, "start"), Transition)
        # m1: fails once, retries, then fails for good; a late start is refused
        for event in ("transient_error", "retry", "fatal_error"):
            assert isinstance(agent.propose_and_wait("m1", event), Transition)
        refused = agent.propose_and_wait("m1", "start")
        assert isinstance(refused, Rejection) and refused.code.value == "terminal_state"
        # m2: waits for approval and gets it; a second approval is an invalid transition
        paused = agent.propose_and_wait("m2", "pause_for_approval")
        assert isinstance(paused, Transition)
        assert isinstance(approver.decide("m2", pause=paused.revision), Transition)
        refused = approver.decide("m2", pause=paused.revision)
        assert isinstance(refused, Rejection) and refused.code.value == "invalid_transition"
        # and one record that is not a proposal at all
        agent.send_raw(b"m3", b"not json")
        agent.flush()
        got: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for _ in range(50):  # the DLQ record's checkpoint may trail the last answer
            got = scrape(worker)
            if got.get(("runstate_dead_letters_total", frozenset())) == 1:
                break
            time.sleep(0.2)
    finally:
        agent.close()
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
    assert sample("runstate_aborts_total") == 0  # none here; Faust has no transactions
    assert sample("runstate_restore_in_progress") == 0
    # aiokafka knows a partition's end once a fetch returned records of it: the Faust
    # runtime reports lag for the partitions that had proposals, and 0 there
    lagging = range(3) if runtime == "native" else {partition_for(r, 3) for r in ("m1", "m2", "m3")}
    for partition in lagging:
        assert sample("runstate_consumer_lag", partition=str(partition)) == 0
    if runtime == "native":
        # Its stores hold the proposals' runs in memtables: RocksDB's memory shows.
        assert sample("runstate_store_memory_bytes", kind="memtables") > 0
        assert sample("runstate_store_memory_bytes", kind="block_cache") >= 0
        # The unfinished of its three runs are kept decoded; a failed one is not.
        assert 1 <= sample("runstate_snapshot_cache_runs") <= 2
        return
    assert sample("runstate_transaction_records_count") == 12  # one per proposal delivered

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


@pytest.mark.parametrize("runtime", ["native", "faust"])
def test_json_logs_at_their_levels(env: Env, runtime: str) -> None:
    """--log-format json: DEBUG per committed (Faust: acknowledged) transition, WARNING per
    rejection, each a JSON object with the fields a log pipeline indexes; every line the
    worker logs is one (Faust's own too)."""
    worker = WorkerProcess(
        env, env.tmp / "w1", "--log-format", "json", "--log-level", "debug", runtime=runtime
    )
    client = env.client()
    try:
        worker.wait_ready(partitions=3)
        assert isinstance(client.create_and_wait("j1", M, deadlines=SLOW), Transition)
        refused = client.propose_and_wait("j1", "complete")
        assert isinstance(refused, Rejection)
    finally:
        client.close()
        assert worker.terminate() == 0, worker.log()
    logged = worker.log_path.read_text().splitlines()
    lines = [json.loads(line) for line in logged if line.startswith("{")]
    # nothing written before a log line on the same line (Faust's spinner did)
    assert not [line for line in logged if '"logger": ' in line and not line.startswith("{")]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    # Faust's loggers (faust.*, aiokafka, mode) go through the same formatter
    assert {line["logger"].split(".")[0] for line in lines} >= (
        {"runstate", "faust"} if runtime == "faust" else {"runstate"}
    )
    assert not [line for line in logged if line.startswith(("[20", "INFO", "WARNING"))]
    outcomes = [line for line in lines if line["logger"] == "runstate.outcomes"]
    assert [(o["level"], o.get("to_state"), o.get("code")) for o in outcomes] == [
        ("DEBUG", "planned", None),
        ("WARNING", None, refused.code.value),
    ]
    assert outcomes[0]["run_id"] == outcomes[1]["run_id"] == "j1"


TOKEN = "obs-token-0123456789abcdef"


def _counted(worker: WorkerProcess) -> bool:
    """The worker's /stats counts the six paused and the two running runs."""
    stats = {(s["machine"], s["state"]): s["runs"] for s in worker.get("/stats")["states"]}
    return stats.get((M, "paused")) == 6 and stats.get((M, "running")) == 2


@pytest.mark.parametrize("runtime", ["native", "faust"])
def test_runs_by_state_across_workers_from_either_worker(env: Env, runtime: str) -> None:
    """GET /runs?state= and /stats answer for the whole cluster whichever worker is
    asked: paused runs in every partition, paged longest-waiting first. The workers have
    an HTTP token: every endpoint but /livez wants it (also from each other)."""
    paused = []
    for n in range(100):  # two paused runs in each partition, whoever owns it
        run_id = f"q{n}"
        if sum(partition_for(r, 3) == partition_for(run_id, 3) for r in paused) < 2:
            paused.append(run_id)
        if len(paused) == 6:
            break
    running = ["q-run-a", "q-run-b"]
    ports = free_ports(2)
    peers = ("--peer", f"http://127.0.0.1:{ports[0]}", "--peer", f"http://127.0.0.1:{ports[1]}")
    first = WorkerProcess(
        env, env.tmp / "w1", *peers, runtime=runtime, http_token=TOKEN, port=ports[0]
    )
    second = WorkerProcess(
        env, env.tmp / "w2", *peers, runtime=runtime, http_token=TOKEN, port=ports[1]
    )
    client, workers = env.client(), [first, second]
    try:
        first.wait_ready()
        second.wait_ready()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            owned = [set((w.health() or {}).get("partitions", [])) for w in workers]
            if all(owned) and set.union(*owned) == {0, 1, 2}:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"partitions not shared by both workers: {owned}")
        for run_id in paused + running:
            assert isinstance(client.create_and_wait(run_id, M, deadlines=SLOW), Transition)
            assert isinstance(client.propose_and_wait(run_id, "start"), Transition)
        for run_id in paused:
            assert isinstance(client.propose_and_wait(run_id, "pause_for_approval"), Transition)
        for worker in workers:  # once the last commit has reached the stores (Faust: its index)
            eventually("both workers count every run", lambda w=worker: _counted(w) or None)
            pages, after = [], None
            while True:
                query = "/runs?state=paused&limit=4" + (f"&after={after}" if after else "")
                page = worker.get(query)
                assert page["missing_partitions"] == []
                pages += page["runs"]
                after = page["next"]
                if after is None:
                    break
            assert [r["run_id"] for r in pages] == paused  # paused in this order
            newest, after = [], None
            while True:  # the recent changes: every run, the latest to enter its state first
                query = "/runs?order=newest&limit=3" + (f"&after={after}" if after else "")
                page = worker.get(query)
                newest += page["runs"]
                after = page["next"]
                if after is None:
                    break
            # each paused run paused after every run had started; the running ones started last
            assert [r["run_id"] for r in newest] == [*paused[::-1], *running[::-1]]
            assert all(r["state"] == "paused" and r["time_in_state_ms"] >= 0 for r in pages)
            stats = {(s["machine"], s["state"]): s["runs"] for s in worker.get("/stats")["states"]}
            assert stats[(M, "paused")] == 6 and stats[(M, "running")] == 2
            assert stats[(M, "planned")] == 0 and stats[("run_state", "pending")] == 0
        shown = subprocess.run(
            [sys.executable, "-m", "processor.cli.main", "stats", "--worker-url", second.url],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "120", "RUNSTATE_HTTP_TOKEN": TOKEN},
        )
        assert shown.returncode == 0, shown.stderr
        row = next(line for line in shown.stdout.splitlines() if " paused " in line and M in line)
        assert "6" in row.split()
        _every_run_from_one_url(env, second, paused, running)
        mine = set((first.health() or {})["partitions"])  # a run it owns: 200, not 421
        _only_with_the_token(first, next(r for r in paused if partition_for(r, 3) in mine))
    finally:
        client.close()
        for worker in workers:
            assert worker.terminate() == 0, worker.log()


def _every_run_from_one_url(
    env: Env, worker: WorkerProcess, paused: list[str], running: list[str]
) -> None:
    """One worker's URL serves every run, its own and its peer's (asked on the reader's
    behalf): the SDK's snapshot and history, and `runstate get`."""
    reader = RunstateClient(
        KafkaSettings(env.bootstrap),
        env.topics,
        signing_key=env.signing_key("runtime"),
        worker_urls=[worker.url],
        http_token=TOKEN,
    )
    owned = set((worker.health() or {})["partitions"])
    assert {partition_for(r, 3) for r in paused} - owned, "some run must be the peer's"
    try:
        for run_id in paused + running:
            snapshot = reader.snapshot(run_id)
            assert snapshot is not None
            assert snapshot.state == ("paused" if run_id in paused else "running")
            history = reader.history(run_id)
            assert [t.revision for t in history] == list(range(snapshot.revision + 1))
    finally:
        reader.close()
    for run_id in paused:
        shown = subprocess.run(
            [sys.executable, "-m", "processor.cli.main", "get", run_id, "--worker-url", worker.url],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "RUNSTATE_HTTP_TOKEN": TOKEN},
        )
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["state"] == "paused"


def _only_with_the_token(worker: WorkerProcess, run_id: str) -> None:
    """Without the token: 401 and the two challenges; with it (Bearer, or Basic's
    password): served; /livez open."""
    for path in (worker.run_path(run_id), "/metrics", f"/inspect?run={run_id}", "/readyz"):
        status, body, _, headers = _answer(worker.url + path)
        assert status == 401 and "Authorization: Bearer" in json.loads(body)["error"], path
        assert headers.get_all("WWW-Authenticate") == [
            'Bearer realm="runstate"',
            'Basic realm="runstate"',
        ]
        assert _status(worker.url + path, f"Bearer {TOKEN}x")[0] == 401, path
        assert _status(worker.url + path, f"Bearer {TOKEN}")[0] == 200, path
        basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
        assert _status(worker.url + path, f"Basic {basic}")[0] == 200, path
    assert _status(worker.url + "/livez")[0] == 200


def _answer(url: str, authorization: str | None = None) -> tuple[int, bytes, str, Any]:
    headers = {"Authorization": authorization} if authorization else {}
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            return (
                response.status,
                response.read(),
                response.headers["Content-Type"],
                response.headers,
            )
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers["Content-Type"], exc.headers


def _status(url: str, authorization: str | None = None) -> tuple[int, bytes, str]:
    return _answer(url, authorization)[:3]


def test_faust_probes_and_inspector(env: Env) -> None:
    """The Faust runtime's /livez and /readyz (ready once in the group, its table
    recovered and its indexes built; 503 with what it waits for until then) and its
    inspector page, which says that it keeps no refusals."""
    worker = WorkerProcess(env, env.tmp / "w1", runtime="faust")
    client = env.client()
    try:
        began, waited = time.monotonic(), []
        while True:
            assert worker.proc.poll() is None, worker.log()
            assert time.monotonic() - began < 90, f"never ready: {waited}\n{worker.log()}"
            try:
                status, body, kind = _status(worker.url + "/readyz")
            except OSError:  # not listening yet
                time.sleep(0.1)
                continue
            assert kind == "application/json"
            ready = json.loads(body)
            if status == 200:
                assert ready == {"ready": True, "partitions": [0, 1, 2], "waiting": []}
                break
            assert status == 503 and ready["ready"] is False and ready["waiting"], ready
            waited += ready["waiting"]
            time.sleep(0.1)
        status, body, _ = _status(worker.url + "/livez")
        live = json.loads(body)
        assert status == 200 and live["alive"] is True and live["loop_idle_seconds"] < 5
        assert isinstance(client.create_and_wait("i1", M, deadlines=SLOW), Transition)
        assert isinstance(client.propose_and_wait("i1", "start"), Transition)
        assert isinstance(client.propose_and_wait("i1", "pause_for_approval"), Transition)
        assert isinstance(client.propose_and_wait("i1", "start"), Rejection)  # not while paused
        status, body, kind = _status(worker.url + "/inspect?run=i1")
        page = body.decode()
        assert status == 200 and kind.startswith("text/html"), page
        assert 'id="current-state">paused<' in page
        assert page.count('<tr class="transition"') == 3  # read from the transitions topic
        assert 'id="no-refusals"' in page and '<tr class="refused"' not in page
        assert _status(worker.url + "/inspect?run=nobody")[0] == 404
        status, body, _ = _status(worker.url + "/")  # the landing page, not Faust's index
        assert status == 200 and b'name="run"' in body and b'id="states"' in body
        assert b'href="/inspect?state=paused&amp;machine=task_lifecycle"' in body
        assert b'<table id="recent">' in body and b'href="/inspect?run=i1"' in body
        assert _status(worker.url + "/router")[0] == 404  # Faust's own pages are not served
    finally:
        client.close()
        assert worker.terminate() == 0, worker.log()


@pytest.mark.parametrize("runtime", ["native", "faust"])
def test_sigusr1_writes_every_threads_stack_to_the_log(env: Env, runtime: str) -> None:
    """A worker that seems stuck is asked where it stands: SIGUSR1 writes each thread's
    stack to its log, the loop's among them, and it goes on serving (the harness does this
    for every worker of a test whose outcomes do not come)."""
    worker = WorkerProcess(env, env.tmp / "w", runtime=runtime)
    try:
        worker.wait_ready(partitions=3)
        stacks = worker.stacks()
        assert "Thread 0x" in stacks and "processor/cli/main.py" in stacks, stacks
        assert worker.health() is not None
    finally:
        assert worker.terminate() == 0, worker.log()
