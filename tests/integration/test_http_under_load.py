"""HTTP readers hammer a native worker's API while it decides a steady stream.

The partition store's snapshot cache was once touched by HTTP threads under a lock and
by the worker's loop without it; a KeyError there turned a valid proposal into a DLQ
"internal error". Here 6 threads read every endpoint in a tight loop for the whole
stream: no DLQ record, no HTTP error, every proposal exactly one outcome."""

import http.client
import json
import random
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from processor.kafka.topics import TopicNames
from tests.integration.harness import (
    Env,
    WorkerProcess,
    assert_guarantee,
    make_env,
    signed_records,
    wait_for_outcomes,
)

RUNS = 300
# Runs that are only created: with them each partition store holds more runs than its
# snapshot cache (2,000), so the cache evicts while HTTP threads read through it.
CROWD = 7_200
STREAM_SECONDS = 20.0
READERS = 6
WAITING = {"run_state": "need_approval", "task_lifecycle": "pause_for_approval"}
WAITING_STATE = {"run_state": "waiting_approval", "task_lifecycle": "paused"}


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def steady_plan(seed: int = 14) -> list[dict[str, Any]]:
    """About ten proposals per run, all valid and signed by an allowed principal: create,
    start, a few steps (started, then succeeded), then complete, wait for approval, or
    stay running. One run in ten repeats a succeeded step (a `duplicate_step`
    rejection), so nearly all commit. And CROWD runs only created. Runs interleaved,
    each run's own order kept."""
    rng = random.Random(seed)
    per_run: list[list[dict[str, Any]]] = []
    for r in range(RUNS):
        run_id = f"load-{r}"
        machine = "run_state" if r % 2 else "task_lifecycle"
        items: list[dict[str, Any]] = [
            {"event": "create", "key": "runtime", "payload": {"machine": machine}},
            {"event": "start", "key": "runtime"},
        ]
        for i in range(rng.randint(3, 4)):
            step = f"s{i}"
            items.append(
                {
                    "event": "step_started",
                    "key": "runtime",
                    "payload": {"step": step, "idempotency_key": f"{run_id}:{step}"},
                }
            )
            items.append(
                {
                    "event": "step_succeeded",
                    "key": "runtime",
                    "payload": {"step": step, "result": {"n": i}},
                }
            )
        if rng.random() < 0.1:
            items.append(
                {
                    "event": "step_started",
                    "key": "runtime",
                    "payload": {"step": "s0", "idempotency_key": f"{run_id}:s0"},
                }
            )
        ending = rng.random()
        if ending < 0.3:
            items.append({"event": "complete", "key": "runtime"})
        elif ending < 0.6:
            items.append({"event": WAITING[machine], "key": "runtime"})
        for item in items:
            item["run_id"] = run_id
        per_run.append(items)
    for r in range(CROWD):
        create = {"event": "create", "key": "runtime", "payload": {"machine": "run_state"}}
        per_run.append([{**create, "run_id": f"crowd-{r}"}])
    plan: list[dict[str, Any]] = []
    while per_run:
        at = rng.randrange(len(per_run))
        queue = per_run[at]
        plan.append(queue.pop(0))
        if not queue:  # swap-remove: 7,500 queues
            per_run[at] = per_run[-1]
            per_run.pop()
    for n, item in enumerate(plan):
        item["proposal_id"] = f"p-load-{n}"
    return plan


@dataclass
class Tally:
    """What the readers saw, shared by them (under `lock`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def count(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.statuses[(endpoint, status)] += 1

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)

    def total(self) -> int:
        with self.lock:
            return sum(self.statuses.values())

    def of(self, endpoint: str, status: int) -> int:
        with self.lock:
            return self.statuses[(endpoint, status)]


def fetch(port: int, path: str) -> tuple[int, str, bytes]:
    """One GET on a fresh connection (the API speaks HTTP/1.0): status, type, body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


def reader(
    port: int,
    stories: list[str],
    crowd: list[str],
    tally: Tally,
    stop: threading.Event,
    seed: int,
) -> None:
    """GET every endpoint in turn until `stop`; each answer counted by endpoint and
    status, anything else than 200/404 (where 404 can mean something) an error, JSON
    bodies parsed and checked, a run's revision never going back between reads."""
    rng = random.Random(seed)
    seen_revision: dict[str, int] = {}

    def run_id() -> str:
        roll = rng.random()
        if roll < 0.5:
            return rng.choice(stories)
        if roll < 0.8:
            return rng.choice(crowd)
        return f"ghost-{rng.randrange(1000)}"  # never proposed

    def quoted(run: str) -> str:
        return urllib.parse.quote(run, safe="")

    def check_snapshot(run: str, body: Any) -> None:
        assert body["run_id"] == run, body
        revision = int(body["revision"])
        assert revision >= seen_revision.get(run, -1), (
            f"{run}: revision {revision} after {seen_revision[run]}"
        )
        seen_revision[run] = revision

    def check_history(run: str, body: Any) -> None:
        revisions = [t["revision"] for t in body]
        assert revisions == list(range(len(revisions))), f"{run}: history {revisions}"
        assert all(t["run_id"] == run for t in body)

    def check_runs(body: Any) -> None:
        assert body["missing_partitions"] == [], body
        assert isinstance(body["runs"], list)

    def check_stats(body: Any) -> None:
        assert body["missing_partitions"] == [], body
        assert isinstance(body["states"], list)

    def check_health(body: Any) -> None:
        assert body["status"] == "ok" and body["partitions"] == [0, 1, 2], body

    # (endpoint, path, may be 404, body: "json" | "html" | "text", check of a 200 body)
    Request = tuple[str, str, bool, str, Callable[[Any], None] | None]

    def requests() -> list[Request]:
        a, b, c = run_id(), run_id(), run_id()
        machine = rng.choice(["run_state", "task_lifecycle"])
        state = rng.choice(["running", "running", WAITING_STATE[machine]])
        return [
            ("run", f"/runs/{quoted(a)}", True, "json", lambda body: check_snapshot(a, body)),
            (
                "history",
                f"/runs/{quoted(b)}/history",
                True,
                "json",
                lambda body: check_history(b, body),
            ),
            ("inspect", f"/inspect?run={quoted(c)}", True, "html", None),
            ("runs-in-state", f"/runs?state={state}&machine={machine}", False, "json", check_runs),
            ("stats", "/stats", False, "json", check_stats),
            ("metrics", "/metrics", False, "text", None),
            ("health", "/health", False, "json", check_health),
        ]

    while not stop.is_set():
        for endpoint, path, may_404, kind, check in requests():
            try:
                status, content_type, raw = fetch(port, path)
            except OSError as exc:  # refused, reset, timed out
                tally.error(f"GET {path}: {type(exc).__name__}: {exc}")
                continue
            tally.count(endpoint, status)
            if status not in ((200, 404) if may_404 else (200,)):
                tally.error(f"GET {path}: {status} {raw[:300]!r}")
                continue
            try:
                if kind == "json":
                    assert content_type.startswith("application/json"), content_type
                    body = json.loads(raw)
                    if status == 200 and check is not None:
                        check(body)
                elif kind == "html":
                    assert content_type.startswith("text/html"), content_type
                    assert raw.lstrip().lower().startswith(b"<!doctype html"), raw[:100]
                else:
                    assert content_type.startswith("text/plain"), content_type
                    assert b"runstate_transitions_total" in raw
            except (AssertionError, ValueError, KeyError, TypeError) as exc:
                tally.error(f"GET {path}: {status} bad body ({exc!r}): {raw[:300]!r}")


def test_http_readers_under_a_steady_stream(env: Env) -> None:
    plan = steady_plan()
    records = signed_records(env, plan)
    run_ids = sorted({item["run_id"] for item in plan})
    stories = [r for r in run_ids if r.startswith("load-")]
    crowd = [r for r in run_ids if r.startswith("crowd-")]
    worker = WorkerProcess(env, env.tmp / "w1", "--commit-interval-ms", "20")
    tally, stop = Tally(), threading.Event()
    threads = [
        threading.Thread(
            target=reader,
            args=(worker.port, stories, crowd, tally, stop, n),
            name=f"reader-{n}",
            daemon=True,
        )
        for n in range(READERS)
    ]
    client = env.client()
    started = time.monotonic()
    try:
        worker.wait_ready(partitions=3)
        for thread in threads:
            thread.start()
        # a steady stream: each record at its share of STREAM_SECONDS
        stream_start = time.monotonic()
        for n, (key, value, headers) in enumerate(records):
            due = stream_start + STREAM_SECONDS * n / len(records)
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            client.send_raw(key, value, headers)
        client.flush(30)
        streamed = time.monotonic() - stream_start
        result = wait_for_outcomes(env, plan, timeout=60)
        stop.set()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads), "a reader hung"
        alive = worker.proc.poll() is None
        health = worker.health()
    finally:
        stop.set()
        client.close()
        code = worker.terminate()
    elapsed = time.monotonic() - started
    log = worker.log_path.read_text(errors="replace")

    by_endpoint: Counter[str] = Counter()
    for (endpoint, _), n in tally.statuses.items():
        by_endpoint[endpoint] += n
    total = tally.total()
    print(
        f"\n{len(plan)} proposals over {len(run_ids)} runs streamed in {streamed:.1f}s; "
        f"{total} HTTP requests by {READERS} readers ({total / streamed:.0f}/s); "
        f"test {elapsed:.1f}s"
    )
    for (endpoint, status), n in sorted(tally.statuses.items()):
        print(f"  {endpoint:<14} {status}  {n}")
    print(
        f"  outcomes: {len(result.transitions)} transitions, "
        f"{len(result.rejections)} rejections, {result.dead_letters} DLQ"
    )

    assert alive, f"the worker died under load:\n{worker.log()}"
    assert code == 0, worker.log()
    assert not tally.errors, f"{len(tally.errors)} HTTP errors, e.g.:\n" + "\n".join(
        tally.errors[:20]
    )
    assert result.dead_letters == 0, f"{result.dead_letters} DLQ records:\n{worker.log()}"
    assert "internal error" not in log.lower(), log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    assert_guarantee(env, plan, result)
    # nearly all commit: only the repeated steps are refused
    assert len(result.transitions) > 0.95 * len(plan)
    assert all(r.code.value == "duplicate_step" for r in result.rejections), {
        r.code.value for r in result.rejections
    }
    # not vacuous: many requests, every endpoint, existing runs actually served
    assert total > 1000, tally.statuses
    assert set(by_endpoint) == {
        "run",
        "history",
        "inspect",
        "runs-in-state",
        "stats",
        "metrics",
        "health",
    }
    for endpoint in ("run", "history", "inspect"):
        assert tally.of(endpoint, 200) > 50 and tally.of(endpoint, 404) > 10, tally.statuses
    assert not any(status == 421 for _, status in tally.statuses), tally.statuses
    assert health is not None and health["stats"]["proposals"] >= len(plan), health
