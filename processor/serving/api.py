"""A worker's HTTP API, whichever its runtime: routing, status codes, JSON shapes and
error messages live here, once. A runtime implements `Node` (what it knows) and its
server hands each GET's path and query string to `answer`, which may block (peers are
asked over HTTP, a Faust worker reads a topic for a history): run it in a thread.

When the worker has tokens, every endpoint but /livez wants one (the rule, its headers
and its words are processor/trust/http_auth.py's); without, a 401 with WWW-Authenticate.

GET /health                  the runtime's identity, owned partitions, counters
GET /livez                   200 while the worker's loop turns, else 503 (restart it)
GET /readyz                  200 when the worker is in its group with every assigned
                             partition's state ready to serve, else 503 with what it
                             waits for (each runtime says what that means: `Node.waiting`)
GET /metrics                 Prometheus metrics (processor/observe/metrics.py)
GET /runs?state=S[&machine=M][&limit=N][&after=CURSOR]
                             runs in a state across the cluster, longest there first
                             (local=1: this worker's partitions only)
GET /stats                   runs per machine and state across the cluster, and the
                             oldest entry in each (local=1: this worker's only)
GET /inspect?run=<run_id>    the run inspector page (HTML); redirects to the owner when it
                             is a configured peer
GET /runs/<run_id>           the run's committed snapshot (404 unknown, 421 not owned here)
GET /runs/<run_id>/history   the run's transitions, oldest first
    [?min_revision=N[&at_ms=T]]
                             read your writes: wait (up to CATCH_UP_S) until this worker
                             has applied the run's transition N, committed at broker
                             time T, else 503; a client that saw it sends both
Only committed state is served: what the runtime made durable, never staged changes;
and a read of runs waits (up to CATCH_UP_S, else 503) for the writes already under way
when it came, so it shows every transition committed before it (read_fence.py).
"""

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qs, quote, unquote

from prometheus_client import CONTENT_TYPE_LATEST

from processor.engine import Machine
from processor.kafka.partitioning import partition_for
from processor.serving import inspector, peers
from processor.serving.read_fence import ReadFence
from processor.trust import http_auth
from schemas.messages import Rejection, RunSnapshot, Transition

log = logging.getLogger("runstate.http")
#: /livez fails when the worker's loop has not turned for this long, /readyz sooner.
LIVE_WITHIN_S = 60.0
READY_WITHIN_S = 15.0
#: How long a read waits for the worker's state to have what it must show.
CATCH_UP_S = 5.0
CATCH_UP_POLL_S = 0.01
#: Reads that may wait for a revision at once; more are answered 503 at once.
MAX_WAITING_READS = 32
_WAITING = threading.BoundedSemaphore(MAX_WAITING_READS)
JSON = "application/json"
HTML = "text/html; charset=utf-8"
ENDPOINTS = (
    "no such endpoint; try /health, /livez, /readyz, /metrics, /stats, "
    "/runs?state=..., /runs/<run_id>[/history]"
)


@dataclass(frozen=True)
class Answer:
    """What the server sends back: status, Content-Type, body and any other headers (a
    name may come more than once: a 401's challenges)."""

    status: int
    content_type: str
    body: bytes
    headers: Sequence[tuple[str, str]] = ()


@dataclass(frozen=True)
class RunRecord:
    """What a worker that owns a run's partition knows of it, as committed."""

    snapshot: RunSnapshot | None
    history: Sequence[Transition] = ()
    #: The run's refused proposals; None when the runtime keeps none (Faust).
    refusals: Sequence[Rejection] | None = ()


class Node(Protocol):
    """What the API asks of a runtime. Called from server threads: each runtime reads its
    state the way that is safe for it (the native one under its stores' lock, the Faust
    one on its event loop)."""

    @property
    def machines(self) -> Mapping[str, Machine]: ...

    @property
    def partition_count(self) -> int:
        """The proposals topic's partitions (0 until the worker has looked)."""

    @property
    def advertised_url(self) -> str | None:
        """The URL other workers reach this one at (it is in the group's description)."""

    @property
    def http_tokens(self) -> http_auth.HttpTokens:
        """The tokens this worker accepts; it sends the first to the other workers."""

    @property
    def configured_peers(self) -> Sequence[str]:
        """The other workers' URLs as configured (`peers.origin`s): the only ones it
        asks, sends its token to, or redirects a browser to."""

    @property
    def read_fence(self) -> ReadFence:
        """The writes whose outcomes may be seen before this worker's state has them."""

    def owned(self) -> list[int]:
        """The partitions whose state this worker holds and serves now."""

    def run(self, run_id: str, partition: int, *, history: bool) -> RunRecord | None:
        """The run in `partition` (None when this worker does not own it); its history
        and refusals only when `history` (they cost more)."""

    def runs_in_state(
        self, machine: str | None, state: str, after: tuple[int, str] | None, limit: int
    ) -> Sequence[peers.RunInState]:
        """The owned runs in `state`, longest there first, at most `limit` after `after`."""

    def local_stats(self) -> list[peers.StateStats]:
        """Runs per machine and state over the owned partitions, every state included."""

    def peers(self) -> list[peers.Peer]:
        """The group's members that advertise a URL, and what each owns."""

    def health(self) -> dict[str, Any]:
        """GET /health's body: who this is, what it owns, its counters."""

    def loop_idle_seconds(self) -> float:
        """How long since the worker's loop last turned."""

    def waiting(self) -> list[str]:
        """What keeps the worker from being ready, in words (empty: ready), its loop aside."""

    def metrics(self) -> bytes:
        """The Prometheus exposition."""


def answer(node: Node, path: str, query: str, authorization: str | None = None) -> Answer:
    """The answer to GET `path`?`query` (both as sent: percent-encoded), asked with
    `authorization` (the request's Authorization header, if any)."""
    parts = [unquote(p) for p in path.strip("/").split("/")]
    refused = http_auth.refusal(node.http_tokens, "/".join(parts), authorization)
    if refused is not None:
        body = json.dumps({"error": refused}).encode()
        return Answer(401, JSON, body, http_auth.CHALLENGES)
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    if parts == ["runs"]:
        return _runs_in_state(node, params)
    if parts == ["stats"]:
        return _stats(node, params)
    if parts == ["inspect"] or parts == [""]:
        return _inspect(node, params.get("run", "").strip())
    if parts == ["health"]:
        return _json(200, node.health())
    if parts == ["livez"]:
        return _livez(node)
    if parts == ["readyz"]:
        return _readyz(node)
    if parts == ["metrics"]:
        return Answer(200, CONTENT_TYPE_LATEST, node.metrics())
    if len(parts) == 2 and parts[0] == "runs":
        return _run(node, parts[1], params, history=False)
    if len(parts) == 3 and parts[0] == "runs" and parts[2] == "history":
        return _run(node, parts[1], params, history=True)
    return _json(404, {"error": ENDPOINTS})


def _json(status: int, body: Any) -> Answer:
    return Answer(status, JSON, json.dumps(body).encode())


def _html(status: int, text: str) -> Answer:
    return Answer(status, HTML, text.encode())


def _partition(node: Node, run_id: str) -> int:
    count = node.partition_count
    return partition_for(run_id, count) if count else 0


def _livez(node: Node) -> Answer:
    """Alive: the worker's loop turned lately (a restart is the cure otherwise)."""
    idle = node.loop_idle_seconds()
    alive = idle < LIVE_WITHIN_S
    return _json(200 if alive else 503, {"alive": alive, "loop_idle_seconds": round(idle, 1)})


def _readyz(node: Node) -> Answer:
    """Ready: what the runtime waits for, and a loop that turns."""
    waiting = node.waiting()
    idle = node.loop_idle_seconds()
    if idle >= READY_WITHIN_S:
        waiting.append(f"its loop has not turned for {idle:.0f} s")
    body = {"ready": not waiting, "partitions": node.owned(), "waiting": waiting}
    return _json(200 if not waiting else 503, body)


def _cluster(
    node: Node, path: str, params: dict[str, str], local: Any
) -> tuple[list[Any], list[int]]:
    """This worker's answer and every other worker's; with the partitions whose owners
    did not answer."""
    pages, covered = [local], set(node.owned())
    url = node.advertised_url
    asked = {_origin_or_none(url)}  # itself, then each peer once
    for peer in node.peers():
        if peer.url == url:
            continue
        target = peers.configured_peer(peer.url, node.configured_peers)
        if target is None:
            log.warning("%s", peers.unconfigured(peer))
            continue
        if target in asked:
            continue
        asked.add(target)
        try:
            answered = peers.ask(target, path, params, node.http_tokens.first())
        except (OSError, ValueError) as exc:
            log.warning("%s did not answer %s: %s", target, path, exc)
            continue
        pages.append(answered["items"])
        covered |= set(answered["partitions"])
    missing = sorted(set(range(node.partition_count)) - covered)
    return pages, missing


def _origin_or_none(url: str | None) -> str | None:
    try:
        return None if url is None else peers.origin(url)
    except ValueError:
        return None


def _fenced(node: Node) -> Answer | None:
    """None once the commits under way when the read came have reached this worker's
    state (read_fence.py); else, after CATCH_UP_S, the 503 to answer."""
    if node.read_fence.wait(CATCH_UP_S):
        return None
    return _json(
        503,
        {
            "error": f"a commit under way did not reach this worker's state within "
            f"{CATCH_UP_S:g} s (is the broker reachable?): ask again"
        },
    )


def _runs_in_state(node: Node, params: dict[str, str]) -> Answer:
    if (fenced := _fenced(node)) is not None:
        return fenced
    state = params.get("state")
    try:
        if not state:
            raise ValueError("give a state: /runs?state=paused[&machine=...]")
        limit = int(params.get("limit", "100"))
        if not 1 <= limit <= 1000:
            raise ValueError("limit must be 1 to 1000")
        after = peers.parse_cursor(params.get("after"))
    except ValueError as exc:
        return _json(400, {"error": str(exc)})
    now_ms = int(time.time() * 1000)
    local = [
        {
            "run_id": r.run_id,
            "machine": r.machine,
            "state": r.state,
            "entered_state_at_ms": r.entered_ms,
            "time_in_state_ms": max(0, now_ms - r.entered_ms),
        }
        for r in node.runs_in_state(params.get("machine"), state, after, limit)
    ]
    if params.get("local") == "1":
        return _json(200, {"items": local, "partitions": node.owned()})
    pages, missing = _cluster(node, "/runs", params, local)
    runs, cursor = peers.merge_runs(pages, limit)
    return _json(200, {"runs": runs, "next": cursor, "missing_partitions": missing})


def _stats(node: Node, params: dict[str, str]) -> Answer:
    if (fenced := _fenced(node)) is not None:
        return fenced
    local = [
        {"machine": m, "state": s, "runs": n, "oldest_entered_ms": oldest}
        for m, s, n, oldest in node.local_stats()
    ]
    if params.get("local") == "1":
        return _json(200, {"items": local, "partitions": node.owned()})
    pages, missing = _cluster(node, "/stats", params, local)
    return _json(200, {"states": peers.merge_stats(pages), "missing_partitions": missing})


def _inspect(node: Node, run_id: str) -> Answer:
    now_ms = int(time.time() * 1000)
    if not run_id:
        return _html(200, inspector.page("", None, None, [], [], now_ms))
    partition = _partition(node, run_id)
    if partition in node.owned() and (fenced := _fenced(node)) is not None:  # read it fresh
        return fenced
    record = node.run(run_id, partition, history=True)
    if record is None:
        claimed = next((p for p in node.peers() if partition in p.partitions), None)
        # A browser is sent to a configured peer only, never to an advertised address.
        owner = None
        if claimed is not None and claimed.url != node.advertised_url:
            owner = peers.configured_peer(claimed.url, node.configured_peers)
            if owner is None:
                log.warning("%s", peers.unconfigured(claimed))
        if owner is not None and owner != _origin_or_none(node.advertised_url):
            location = f"{owner}/inspect?run={quote(run_id, safe='')}"
            return Answer(307, "text/plain", b"", (("Location", location),))
        problem = (
            f"Run '{run_id}' lives in partition {partition}, whose owner is not known now "
            "(or is not among this worker's configured peers, --peer)."
        )
        return _html(503, inspector.page(run_id, None, None, [], [], now_ms, problem))
    snapshot = record.snapshot
    machine = node.machines.get(snapshot.machine) if snapshot is not None else None
    status = 200 if snapshot is not None else 404
    page = inspector.page(run_id, machine, snapshot, record.history, record.refusals, now_ms)
    return _html(status, page)


def _run(node: Node, run_id: str, params: dict[str, str], history: bool) -> Answer:
    partition = _partition(node, run_id)
    wanted: list[int | None] = []
    for name in ("min_revision", "at_ms"):
        value = params.get(name)
        if value is not None and not (value.isdigit() and value.isascii()):
            return _json(400, {"error": f"{name} must be a whole number, not {value!r}"})
        wanted.append(None if value is None else int(value))
    revision, at_ms = wanted
    # Not owned here: said at once (a stuck commit of this worker is not the reader's).
    record: RunRecord | None = None
    if partition in node.owned():
        if (fenced := _fenced(node)) is not None:
            return fenced
        found = _caught_up(node, run_id, partition, revision, at_ms)
        if isinstance(found, Answer):
            return found
        record = found
    if record is None:
        return _json(
            421,
            {
                "error": f"run '{run_id}' lives in partition {partition}, which this "
                "worker does not own; ask the worker that does",
                "partition": partition,
            },
        )
    if record.snapshot is None:
        return _json(404, {"error": f"no run '{run_id}'", "partition": partition})
    if not history:
        return Answer(200, JSON, record.snapshot.model_dump_json().encode())
    with_history = node.run(run_id, partition, history=True)
    if with_history is None:
        return _json(503, {"error": f"run '{run_id}' moved while read: ask again"})
    if with_history.snapshot is None:  # forgotten since
        return _json(404, {"error": f"no run '{run_id}'", "partition": partition})
    return _json(200, [json.loads(t.model_dump_json()) for t in with_history.history])


def _caught_up(
    node: Node, run_id: str, partition: int, revision: int | None, at_ms: int | None
) -> RunRecord | Answer | None:
    """The run as this worker has it, once it has applied the run's transition
    `revision`, committed at broker time `at_ms` (as it is, when `revision` is None).

    The read fence already waited for this worker's own commits, so a run it lacks is
    gone (forgotten) or never was: that is answered at once. A run older than asked is
    waited for, briefly: a reader told of a transition by another worker (one that owned
    the partition before, or a stale one) asks one that may not have applied it yet."""
    record = node.run(run_id, partition, history=False)
    if _settled(record, revision, at_ms):
        return record
    assert record is not None and revision is not None
    # Each waiting read holds a server thread for up to CATCH_UP_S: a bounded number do,
    # so revisions asked far ahead (by mistake or not) cannot pile threads up.
    if not _WAITING.acquire(blocking=False):
        return _behind(run_id, record, revision, "too many reads are waiting already")
    try:
        deadline = time.monotonic() + CATCH_UP_S
        while time.monotonic() < deadline:
            time.sleep(CATCH_UP_POLL_S)
            record = node.run(run_id, partition, history=False)
            if _settled(record, revision, at_ms):
                return record
            assert record is not None
        return _behind(run_id, record, revision, f"after {CATCH_UP_S:g} s")
    finally:
        _WAITING.release()


def _settled(record: RunRecord | None, revision: int | None, at_ms: int | None) -> bool:
    """Nothing to wait for: not owned, no such run, no revision asked, or applied."""
    if record is None or record.snapshot is None or revision is None:
        return True
    return _applied(record.snapshot, revision, at_ms)


def _behind(run_id: str, record: RunRecord, revision: int, why: str) -> Answer:
    have = -1 if record.snapshot is None else record.snapshot.revision
    return _json(
        503,
        {
            "error": f"this worker has run '{run_id}' at revision {have}, older than the "
            f"{revision} asked for ({why}): it has not applied it yet; ask again",
            "revision": have,
            "min_revision": revision,
        },
    )


def _applied(snapshot: RunSnapshot, revision: int, at_ms: int | None) -> bool:
    """Whether `snapshot` is at or after the transition (`revision`, `at_ms`): at that
    revision or later, or a run of that id created after the transition was committed
    (the id forgotten and used again). The revision comes first: broker time is not
    monotonic across a leader change to a broker whose clock is behind."""
    if snapshot.revision >= revision:
        return True
    return at_ms is not None and snapshot.created_at_ms > at_ms
