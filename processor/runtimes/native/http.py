"""The native worker's HTTP server: http.server in a thread, each GET answered by the
runtime-independent API (processor/serving/api.py, which lists the endpoints) over the worker's
`WorkerQueries`."""

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from processor.runtimes.native.queries import WorkerQueries
from processor.runtimes.native.worker import Worker
from processor.serving import api

log = logging.getLogger("runstate.http")


class _Handler(BaseHTTPRequestHandler):
    node: WorkerQueries  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        answer = api.answer(self.node, path, query, self.headers.get("Authorization"))
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        for name, value in answer.headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(answer.body)


def serve(worker: Worker, host: str, port: int) -> ThreadingHTTPServer:
    """Start the API in a daemon thread; `server.server_address` says where."""
    handler = type("Handler", (_Handler,), {"node": WorkerQueries(worker)})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="runstate-http", daemon=True).start()
    return server
