"""The HTTP API both runtimes serve (processor/serving/, routed by api.py), over a node
made of plain data: routing, status codes, JSON shapes, messages (no broker, no server)."""

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from prometheus_client import CONTENT_TYPE_LATEST

from processor.engine import Machine
from processor.kafka.partitioning import partition_for
from processor.machines import builtin_machines
from processor.runtimes.native import http
from processor.serving import api, probes
from processor.serving.answers import HTML, JSON, Answer
from processor.serving.node import RunRecord
from processor.serving.peers import Peer, StateQuery, StateStats, origin
from processor.serving.read_fence import ReadFence
from processor.trust.http_auth import HttpTokens
from schemas.messages import RunSnapshot
from tests.unit.driver import Driver

M = "task_lifecycle"


@dataclass(frozen=True)
class Row:
    entered_ms: int
    run_id: str
    machine: str
    state: str


@dataclass
class FakeNode:
    """A worker that owns `owned` of `partition_count` partitions and holds `runs`."""

    runs: dict[str, Driver] = field(default_factory=dict)
    owned_partitions: list[int] = field(default_factory=lambda: [0, 1, 2])
    partition_count: int = 3
    advertised_url: str | None = "http://me"
    peer_list: list[Peer] = field(default_factory=list)
    configured_peers: tuple[str, ...] = ()
    rows: list[Row] = field(default_factory=list)
    idle: float = 0.1
    waits: list[str] = field(default_factory=list)
    keeps_refusals: bool = True
    http_tokens: HttpTokens = field(default_factory=HttpTokens)  # none: the API is open
    read_fence: ReadFence = field(default_factory=ReadFence)

    @property
    def machines(self) -> Mapping[str, Machine]:
        return builtin_machines()

    def owned(self) -> list[int]:
        return list(self.owned_partitions)

    def run(self, run_id: str, partition: int, *, history: bool) -> RunRecord | None:
        if partition not in self.owned_partitions:
            return None
        driver = self.runs.get(run_id)
        snapshot: RunSnapshot | None = driver.snapshot if driver else None
        if driver is None or not history:
            return RunRecord(snapshot)
        refusals = [] if self.keeps_refusals else None
        return RunRecord(snapshot, driver.history, refusals)

    def runs_in_state(self, query: StateQuery) -> list[Row]:
        found = sorted(
            (
                r
                for r in self.rows
                if query.state in (None, r.state) and query.machine in (None, r.machine)
            ),
            key=lambda r: (r.entered_ms, r.run_id),
            reverse=query.newest,
        )
        found = [r for r in found if query.beyond(r.entered_ms, r.run_id)]
        return found[: query.limit]

    def local_stats(self) -> list[StateStats]:
        return [(M, "paused", len(self.rows), min((r.entered_ms for r in self.rows), default=None))]

    def peers(self) -> list[Peer]:
        return list(self.peer_list)

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "partitions": self.owned()}

    def loop_idle_seconds(self) -> float:
        return self.idle

    def waiting(self) -> list[str]:
        return list(self.waits)

    def metrics(self) -> bytes:
        return b"runstate_runs 1\n"


@contextmanager
def served_over_http(node: FakeNode) -> Iterator[str]:
    """The native runtime's adapter (processor/runtimes/native/http.py) over `node`: its URL."""
    handler = type("Handler", (http._Handler,), {"node": node})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def get(node: FakeNode, url: str, authorization: str | None = None) -> tuple[int, Any, Answer]:
    parts = urlsplit(url)
    answer = api.answer(node, parts.path, parts.query, authorization)
    body: Any = answer.body
    if answer.content_type == JSON:
        body = json.loads(answer.body)
    elif answer.content_type == HTML:
        body = answer.body.decode()
    return answer.status, body, answer


def owned_run(run_id: str) -> Driver:
    run = Driver(run_id=run_id)
    run.create(M)
    run.commit("start")
    return run


def test_a_run_its_history_and_the_errors_for_runs_not_here() -> None:
    run_id = "a/b c"  # percent-encoded in the path, as clients send it
    node = FakeNode(runs={run_id: owned_run(run_id)})
    status, body, answer = get(node, "/runs/a%2Fb%20c")
    assert status == 200 and body["state"] == "running" and answer.content_type == JSON
    status, body, _ = get(node, "/runs/a%2Fb%20c/history")
    assert status == 200 and [t["revision"] for t in body] == [0, 1]
    partition = partition_for("nope", 3)
    assert get(node, "/runs/nope")[:2] == (404, {"error": "no run 'nope'", "partition": partition})
    node.owned_partitions = []
    status, body, _ = get(node, "/runs/nope/history")
    assert status == 421 and body["partition"] == partition
    assert "which this worker does not own; ask the worker that does" in body["error"]


def test_unknown_paths_name_the_endpoints() -> None:
    status, body, _ = get(FakeNode(), "/runs/x/y/z")
    assert status == 404 and body["error"].startswith("no such endpoint; try /health")


def test_health_metrics_livez_readyz() -> None:
    node = FakeNode()
    assert get(node, "/health")[:2] == (200, {"status": "ok", "partitions": [0, 1, 2]})
    status, body, answer = get(node, "/metrics")
    assert status == 200 and body == b"runstate_runs 1\n"
    assert answer.content_type == CONTENT_TYPE_LATEST
    assert get(node, "/livez")[:2] == (200, {"alive": True, "loop_idle_seconds": 0.1})
    assert get(node, "/readyz")[:2] == (
        200,
        {"ready": True, "partitions": [0, 1, 2], "waiting": []},
    )
    node.waits = ["rebalancing"]
    node.idle = probes.READY_WITHIN_S + 1
    status, body, _ = get(node, "/readyz")
    assert status == 503 and body["ready"] is False
    assert body["waiting"] == ["rebalancing", "its loop has not turned for 16 s"]
    assert get(node, "/livez")[0] == 200
    node.idle = probes.LIVE_WITHIN_S
    assert get(node, "/livez")[:2] == (503, {"alive": False, "loop_idle_seconds": 60.0})


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("", "give a state: /runs?state=paused[&machine=...], or order=newest"),
        ("state=paused&order=random", "order is longest (longest in the state first) or newest"),
        ("state=paused&limit=0", "limit must be 1 to 1000"),
        ("state=paused&limit=1001", "limit must be 1 to 1000"),
        ("state=paused&after=nonsense", "after='nonsense' is not a cursor from a previous page"),
    ],
)
def test_runs_in_state_refuses_bad_queries(query: str, error: str) -> None:
    assert get(FakeNode(), f"/runs?{query}")[:2] == (400, {"error": error})


def test_runs_in_state_local_and_paged() -> None:
    rows = [Row(30, "c", M, "paused"), Row(10, "a", M, "paused"), Row(20, "b", M, "paused")]
    node = FakeNode(rows=rows)
    status, body, _ = get(node, "/runs?state=paused&local=1")
    assert status == 200 and body["partitions"] == [0, 1, 2]
    assert [r["run_id"] for r in body["items"]] == ["a", "b", "c"]
    assert set(body["items"][0]) == {
        "run_id",
        "machine",
        "state",
        "entered_state_at_ms",
        "time_in_state_ms",
    }
    status, body, _ = get(node, "/runs?state=paused&limit=2")
    assert [r["run_id"] for r in body["runs"]] == ["a", "b"] and body["next"] == "20:b"
    assert body["missing_partitions"] == []
    status, body, _ = get(node, "/runs?state=paused&limit=2&after=20:b")
    assert [r["run_id"] for r in body["runs"]] == ["c"] and body["next"] is None
    node.rows.append(Row(25, "d", M, "running"))
    status, body, _ = get(node, "/runs?order=newest&limit=3")  # any state, latest first
    assert [r["run_id"] for r in body["runs"]] == ["c", "d", "b"] and body["next"] == "20:b"
    status, body, _ = get(node, "/runs?order=newest&limit=3&after=20:b")
    assert [r["run_id"] for r in body["runs"]] == ["a"] and body["next"] is None


@pytest.fixture
def peer() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """Another worker, over HTTP: answers local=1 for partition 2 and records what it
    was asked."""
    asked: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            asked.append({k: v[-1] for k, v in parse_qs(query).items()} | {"path": path})
            if self.headers.get("Authorization"):  # the token a worker sends its peers
                asked[-1]["authorization"] = self.headers["Authorization"]
            if path == "/runs":
                items: list[dict[str, Any]] = [
                    {"run_id": "p", "entered_state_at_ms": 15, "machine": M, "state": "paused"}
                ]
            else:
                items = [{"machine": M, "state": "paused", "runs": 4, "oldest_entered_ms": 5}]
            data = json.dumps({"items": items, "partitions": [2]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()


def test_cluster_queries_ask_the_peers_and_name_partitions_nobody_answered_for(
    peer: tuple[str, list[dict[str, str]]],
) -> None:
    url, asked = peer
    node = FakeNode(
        rows=[Row(10, "a", M, "paused"), Row(20, "b", M, "paused")],
        owned_partitions=[0],
        partition_count=4,
        peer_list=[
            Peer("http://me", (0,)),  # itself: not asked
            Peer(url, (2,)),
            Peer("http://127.0.0.1:9", (1,)),  # does not answer
        ],
        configured_peers=(origin(url), "http://127.0.0.1:9"),
    )
    status, body, _ = get(node, "/runs?state=paused")
    assert status == 200
    assert [r["run_id"] for r in body["runs"]] == ["a", "p", "b"]
    assert body["missing_partitions"] == [1, 3]
    assert asked == [{"state": "paused", "local": "1", "path": "/runs"}]
    # This peer answers as a worker that knows no order does (its oldest first): its
    # page would not merge into the newest, so its partition counts as missing.
    status, body, _ = get(node, "/runs?order=newest")
    assert [r["run_id"] for r in body["runs"]] == ["b", "a"]
    assert body["missing_partitions"] == [1, 2, 3]
    status, body, _ = get(node, "/stats")
    assert body == {
        "states": [{"machine": M, "state": "paused", "runs": 6, "oldest_entered_ms": 5}],
        "missing_partitions": [1, 3],
    }
    assert asked[-1] == {"local": "1", "path": "/stats"}
    status, body, _ = get(node, "/stats?local=1")
    assert body["partitions"] == [0] and body["items"][0]["runs"] == 2


def test_a_worker_with_tokens_asks_its_peers_with_the_first(
    peer: tuple[str, list[dict[str, str]]],
) -> None:
    url, asked = peer
    node = FakeNode(
        peer_list=[Peer(url, (2,))],
        http_tokens=HttpTokens(["t-first", "t-next"]),
        configured_peers=(origin(url),),
    )
    status, _, _ = get(node, "/stats", "Bearer t-next")  # any of them lets the client in
    assert status == 200
    assert asked == [{"local": "1", "path": "/stats", "authorization": "Bearer t-first"}]


def test_the_inspector_page_its_redirect_and_a_runtime_without_refusals() -> None:
    node = FakeNode(runs={"r1": owned_run("r1")})
    status, html, answer = get(node, "/")
    assert status == 200 and answer.content_type == HTML and 'name="run"' in html
    status, html, _ = get(node, "/inspect?run=r1")
    assert status == 200 and 'id="current-state">running<' in html and "0 refusals" in html
    node.keeps_refusals = False
    status, html, _ = get(node, "/inspect?run=r1")
    assert status == 200 and 'id="no-refusals"' in html
    assert get(node, "/inspect?run=ghost")[0] == 404
    partition = partition_for("r 2", 3)
    node.owned_partitions = [p for p in range(3) if p != partition]
    status, html, _ = get(node, "/inspect?run=r+2")
    assert status == 503 and "whose owner is not known now" in html
    node.peer_list = [Peer("http://other:8080", (partition,))]
    status, html, _ = get(node, "/inspect?run=r%202")  # not a configured peer: no redirect
    assert status == 503 and "configured peers" in html
    node.configured_peers = ("http://other:8080",)
    status, _, answer = get(node, "/inspect?run=r%202")
    location = ("Location", "http://other:8080/inspect?run=r%202")
    assert status == 307 and answer.headers == (location,)
