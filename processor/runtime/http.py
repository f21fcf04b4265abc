"""The worker's HTTP API: a run's snapshot, its transition history, health.

GET /health                  worker id, owned (restored) partitions, counters
GET /livez                   200 while the worker's loop turns, else 503 (restart it)
GET /readyz                  200 when in the group with every assigned partition restored
                             and its clients healthy, else 503 with what it waits for
GET /metrics                 Prometheus metrics (processor/metrics.py)
GET /runs?state=S[&machine=M][&limit=N][&after=CURSOR]
                             runs in a state across the cluster, longest there first
                             (local=1: this worker's partitions only)
GET /stats                   runs per machine and state across the cluster, and the
                             oldest entry in each (local=1: this worker's only)
GET /inspect?run=<run_id>    the run inspector page (HTML); redirects to the owner
GET /runs/<run_id>           the run's committed snapshot (404 unknown, 421 not owned here)
GET /runs/<run_id>/history   the run's transitions, oldest first
Only committed state is served: what a checkpoint made durable, never staged changes.
"""

import json
import logging
import threading
import time
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote

from prometheus_client import CONTENT_TYPE_LATEST

from processor.partitioning import partition_for
from processor.runtime import cluster, inspector
from processor.runtime.worker import Worker

log = logging.getLogger("runstate.http")
#: /livez fails when the worker's loop has not turned for this long, /readyz sooner.
LIVE_WITHIN_S = 60.0
READY_WITHIN_S = 15.0


class _Handler(BaseHTTPRequestHandler):
    worker: Worker  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        parts = [unquote(p) for p in path.strip("/").split("/")]
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        if parts == ["runs"]:
            self._runs_in_state(params)
        elif parts == ["stats"]:
            self._stats(params)
        elif parts == ["inspect"] or parts == [""]:
            self._inspect(params.get("run", "").strip())
        elif parts == ["health"]:
            self._health()
        elif parts == ["livez"]:
            self._livez()
        elif parts == ["readyz"]:
            self._readyz()
        elif parts == ["metrics"]:
            self._send(200, self.worker.metrics.render(), CONTENT_TYPE_LATEST)
        elif len(parts) == 2 and parts[0] == "runs":
            self._run(parts[1], history=False)
        elif len(parts) == 3 and parts[0] == "runs" and parts[2] == "history":
            self._run(parts[1], history=True)
        else:
            self._send(
                404,
                {
                    "error": "no such endpoint; try /health, /livez, /readyz, /metrics, /stats, "
                    "/runs?state=..., /runs/<run_id>[/history]"
                },
            )

    def _livez(self) -> None:
        """Alive: the worker's loop turned lately (a restart is the cure otherwise)."""
        idle = time.monotonic() - self.worker.last_turn
        alive = idle < LIVE_WITHIN_S
        self._send(200 if alive else 503, {"alive": alive, "loop_idle_seconds": round(idle, 1)})

    def _readyz(self) -> None:
        """Ready: in the group, every assigned partition restored, clients healthy."""
        worker = self.worker
        waiting = []
        if not worker.assigned:
            waiting.append("not yet given its partitions by the group")
        if worker.restoring:
            waiting.append(f"restoring partitions {worker.restoring}")
        if worker.broken:
            waiting.append("its Kafka clients failed; restarting")
        idle = time.monotonic() - worker.last_turn
        if idle >= READY_WITHIN_S:
            waiting.append(f"its loop has not turned for {idle:.0f} s")
        body = {"ready": not waiting, "partitions": worker.stores.owned(), "waiting": waiting}
        self._send(200 if not waiting else 503, body)

    def _health(self) -> None:
        worker = self.worker
        assigned = worker.stores.owned()
        self._send(
            200,
            {
                "status": "ok",
                "worker_id": worker.worker_id,
                "group_id": worker.config.group_id,
                "partitions": assigned,
                "stats": asdict(worker.stats),
            },
        )

    def _cluster(
        self, path: str, params: dict[str, str], local: Any
    ) -> tuple[list[Any], list[int]]:
        """This worker's answer and, unless local=1, every other worker's; with the
        partitions whose owners did not answer."""
        worker = self.worker
        pages, covered = [local], set(worker.owned())
        if params.get("local") != "1":
            for peer in worker.peers():
                if peer.url == worker.advertised_url:
                    continue
                try:
                    answer = cluster.ask(peer.url, path, params)
                except (OSError, ValueError) as exc:
                    log.warning("%s did not answer %s: %s", peer.url, path, exc)
                    continue
                pages.append(answer["items"])
                covered |= set(answer["partitions"])
        missing = sorted(set(range(worker.partitions)) - covered)
        return pages, missing

    def _runs_in_state(self, params: dict[str, str]) -> None:
        state = params.get("state")
        try:
            if not state:
                raise ValueError("give a state: /runs?state=paused[&machine=...]")
            limit = int(params.get("limit", "100"))
            if not 1 <= limit <= 1000:
                raise ValueError("limit must be 1 to 1000")
            after = cluster.parse_cursor(params.get("after"))
        except ValueError as exc:
            self._send(400, {"error": str(exc)})
            return
        now_ms = int(time.time() * 1000)
        local = [
            {
                "run_id": r.run_id,
                "machine": r.machine,
                "state": r.state,
                "entered_state_at_ms": r.entered_ms,
                "time_in_state_ms": max(0, now_ms - r.entered_ms),
            }
            for r in self.worker.runs_in_state(params.get("machine"), state, after, limit)
        ]
        if params.get("local") == "1":
            self._send(200, {"items": local, "partitions": self.worker.owned()})
            return
        pages, missing = self._cluster("/runs", params, local)
        runs, cursor = cluster.merge_runs(pages, limit)
        self._send(200, {"runs": runs, "next": cursor, "missing_partitions": missing})

    def _stats(self, params: dict[str, str]) -> None:
        local = [
            {"machine": m, "state": s, "runs": n, "oldest_entered_ms": oldest}
            for m, s, n, oldest in self.worker.local_stats()
        ]
        if params.get("local") == "1":
            self._send(200, {"items": local, "partitions": self.worker.owned()})
            return
        pages, missing = self._cluster("/stats", params, local)
        self._send(200, {"states": cluster.merge_stats(pages), "missing_partitions": missing})

    def _inspect(self, run_id: str) -> None:
        worker = self.worker
        now_ms = int(time.time() * 1000)
        if not run_id:
            self._html(200, inspector.page("", None, None, [], [], now_ms))
            return
        partition = partition_for(run_id, worker.partitions) if worker.partitions else 0
        with worker.stores.reading(partition) as store:
            if store is not None:
                snapshot = store.committed_snapshot(run_id)
                history = store.history(run_id) if snapshot is not None else []
                refusals = store.refusals(run_id) if snapshot is not None else []
        if store is None:
            owner = next((p.url for p in worker.peers() if partition in p.partitions), None)
            if owner is not None and owner != worker.advertised_url:
                self.send_response(307)
                self.send_header("Location", f"{owner}/inspect?run={quote(run_id, safe='')}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            problem = (
                f"Run '{run_id}' lives in partition {partition}, whose owner is not known now."
            )
            self._html(503, inspector.page(run_id, None, None, [], [], now_ms, problem))
            return
        machine = worker.config.machines.get(snapshot.machine) if snapshot is not None else None
        status = 200 if snapshot is not None else 404
        self._html(status, inspector.page(run_id, machine, snapshot, history, refusals, now_ms))

    def _html(self, status: int, text: str) -> None:
        self._send(status, text.encode(), "text/html; charset=utf-8")

    def _run(self, run_id: str, history: bool) -> None:
        worker = self.worker
        partition = partition_for(run_id, worker.partitions)
        with worker.stores.reading(partition) as store:
            if store is None:
                self._send(
                    421,
                    {
                        "error": f"run '{run_id}' lives in partition {partition}, which this "
                        "worker does not own; ask the worker that does",
                        "partition": partition,
                    },
                )
                return
            snapshot = store.committed_snapshot(run_id)
            transitions = store.history(run_id) if history and snapshot is not None else []
        if snapshot is None:
            self._send(404, {"error": f"no run '{run_id}'", "partition": partition})
        elif history:
            self._send(200, [json.loads(t.model_dump_json()) for t in transitions])
        else:
            self._send(200, snapshot.model_dump_json().encode())


def serve(worker: Worker, host: str, port: int) -> ThreadingHTTPServer:
    """Start the API in a daemon thread; `server.server_address` says where."""
    handler = type("Handler", (_Handler,), {"worker": worker})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="runstate-http", daemon=True).start()
    return server
