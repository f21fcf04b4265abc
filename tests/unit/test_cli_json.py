"""Commands a script reads print JSON with --json: the same figures as their tables."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from click.testing import CliRunner

from processor.cli.main import cli
from processor.machines import builtin_machines

pytestmark = pytest.mark.unit

STATS = {
    "states": [{"machine": "m", "state": "paused", "runs": 3, "oldest_entered_ms": 1}],
    "missing_partitions": [2],
}


@pytest.fixture
def worker() -> Iterator[str]:
    """A worker's HTTP API as far as /stats goes."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps(STATS).encode()
            self.send_response(200 if self.path == "/stats" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_stats_json_is_the_workers_answer(worker: str) -> None:
    result = CliRunner().invoke(cli, ["stats", "--worker-url", worker, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == STATS
    shown = CliRunner().invoke(cli, ["stats", "--worker-url", worker], env={"COLUMNS": "200"})
    assert "paused" in shown.output and "partitions [2] did not answer" in shown.output


def test_machines_list_json_names_every_machine() -> None:
    result = CliRunner().invoke(cli, ["machines", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["machine"]: row for row in json.loads(result.output)}
    for name, machine in builtin_machines().items():
        assert rows[name]["initial"] == machine.spec.initial
        assert rows[name]["transitions"] == len(machine.spec.transitions)
