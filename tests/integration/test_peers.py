"""On a real broker: a member that joins the workers' consumer group advertising an
address of its own never receives the worker's HTTP token; a member advertising a
configured peer's URL gets that peer asked, with the token."""

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from processor.kafka.topics import TopicNames
from processor.serving.peers import client_id
from tests.integration.harness import Env, WorkerProcess, make_env

TOKEN = "peers-token-0123456789abcdef"


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


@dataclass
class Recorder:
    """A local HTTP server that records each request's Authorization header, answering
    as a worker owning `partitions`."""

    url: str = ""
    seen: list[tuple[str, str | None]] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)


@contextmanager
def recording() -> Iterator[Recorder]:
    recorder = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            recorder.seen.append((self.path, self.headers.get("Authorization")))
            data = json.dumps({"items": [], "partitions": recorder.partitions}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()


class Member:
    """A consumer in the workers' group that advertises `url`, as a worker would; it
    polls in a thread so it stays in the group, and knows what it was assigned."""

    def __init__(self, env: Env, url: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": env.bootstrap,
                "group.id": env.group_id,
                "client.id": client_id(url),
                "partition.assignment.strategy": "cooperative-sticky",
                "enable.auto.commit": False,
                "session.timeout.ms": 6000,
                "log_level": 4,
            }
        )
        self.owned: set[int] = set()
        self._stop = threading.Event()

        def assigned(_: Consumer, partitions: list[TopicPartition]) -> None:
            self.owned |= {tp.partition for tp in partitions}

        def revoked(_: Consumer, partitions: list[TopicPartition]) -> None:
            self.owned -= {tp.partition for tp in partitions}

        self.consumer.subscribe([env.topics.proposals], on_assign=assigned, on_revoke=revoked)
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.consumer.poll(0.2)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def test_a_group_member_advertising_an_unconfigured_url_never_gets_the_token(env: Env) -> None:
    with recording() as evil, recording() as good:
        worker = WorkerProcess(env, env.tmp / "w1", "--peer", good.url, http_token=TOKEN)
        members: list[Member] = []
        try:
            worker.wait_ready(partitions=3)
            members = [Member(env, evil.url), Member(env, good.url)]
            deadline = time.monotonic() + 90
            while True:
                mine = set((worker.health() or {}).get("partitions", []))
                owned = [mine, *(m.owned for m in members)]
                if all(owned) and set.union(*owned) == {0, 1, 2}:
                    break
                assert time.monotonic() < deadline, f"partitions not shared: {owned}"
                time.sleep(0.2)
            good.partitions = sorted(members[1].owned)
            body = worker.get("/stats")
            assert body["missing_partitions"] == sorted(members[0].owned)
            assert evil.seen == []  # never asked, never sent the token
            assert good.seen == [("/stats?local=1", f"Bearer {TOKEN}")]
        finally:
            for member in members:
                member.close()
            assert worker.terminate() == 0, worker.log()
        logged = worker.log_path.read_text()
        assert f"advertises '{evil.url}'" in logged and "--peer" in logged
