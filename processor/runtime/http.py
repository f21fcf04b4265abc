"""The worker's HTTP API: a run's snapshot, its transition history, health.

GET /health                  worker id, assigned partitions, counters
GET /metrics                 Prometheus metrics (processor/runtime/metrics.py)
GET /runs/<run_id>           the run's committed snapshot (404 unknown, 421 not owned here)
GET /runs/<run_id>/history   the run's transitions, oldest first
Only committed state is served: what a checkpoint made durable, never staged changes.
"""

import json
import logging
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from prometheus_client import CONTENT_TYPE_LATEST

from processor.partitioning import partition_for
from processor.runtime.worker import Worker

log = logging.getLogger("runstate.http")


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
        parts = [unquote(p) for p in self.path.split("?", 1)[0].strip("/").split("/")]
        if parts == ["health"]:
            self._health()
        elif parts == ["metrics"]:
            self._send(200, self.worker.metrics.render(), CONTENT_TYPE_LATEST)
        elif len(parts) == 2 and parts[0] == "runs":
            self._run(parts[1], history=False)
        elif len(parts) == 3 and parts[0] == "runs" and parts[2] == "history":
            self._run(parts[1], history=True)
        else:
            self._send(
                404, {"error": "no such endpoint; try /health, /metrics, /runs/<run_id>[/history]"}
            )

    def _health(self) -> None:
        worker = self.worker
        with worker.stores_lock:
            assigned = sorted(worker.stores)
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

    def _run(self, run_id: str, history: bool) -> None:
        worker = self.worker
        partition = partition_for(run_id, worker.partitions)
        with worker.stores_lock:
            store = worker.owner_store(partition)
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
