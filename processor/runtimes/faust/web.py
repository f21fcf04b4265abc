"""The Faust runtime's HTTP API: the same API as the native worker's (processor/serving/api.py
routes, answers and words it), served by Faust's aiohttp server on the agent's event
loop.

Each request is answered in a thread of the loop's executor, so that what may block
(peers asked over HTTP, the group described, a run's history read from the transitions
topic) never holds the agent. What lives on the loop (the table, the in-memory indexes,
the metrics) is read on the loop: the thread hands those reads back to it and waits, so
they never see a structure half-changed by a commit.

Faust's own pages (/router, /table, its index at /) are not served: runstate's API
answers every path, / included (the inspector's search box)."""

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

import faust
from faust.web import Request, Response, View
from faust.web.drivers.aiohttp import Web as AiohttpWeb
from multidict import CIMultiDict

from processor.engine import Machine
from processor.kafka.readback import read_partition
from processor.observe.metrics import WorkerMetrics
from processor.runtimes.faust.history import run_history
from processor.runtimes.faust.observe import Entered, StateIndex
from processor.runtimes.faust.table import RunsTable
from processor.runtimes.faust.timers import DueIndex
from processor.runtimes.faust.transport import Consumer
from processor.runtimes.settings import WorkerConfig
from processor.serving import api, peers
from processor.serving.read_fence import ReadFence
from processor.trust import http_auth
from schemas.messages import RunSnapshot

T = TypeVar("T")
#: How long a request waits for the event loop to read what lives there.
ON_LOOP_TIMEOUT_S = 30.0


class Web(AiohttpWeb):
    """Faust's aiohttp server without Faust's own pages."""

    default_blueprints = ()
    production_blueprints = ()
    debug_blueprints = ()
    optional_blueprints = ()


class FaustNode:
    """What the API asks of the Faust runtime (`api.Node`)."""

    def __init__(
        self,
        *,
        app: faust.App,
        config: WorkerConfig,
        partitions: int,
        runs: RunsTable,
        due_index: DueIndex,
        states: StateIndex,
        metrics: WorkerMetrics,
        stats: Any,  # FaustStats: a dataclass of counters
        owned: Callable[[], list[int]],
        advertised_url: str | None,
        read_fence: ReadFence,
    ) -> None:
        self.app = app
        self.read_fence = read_fence
        self.config = config
        self.partitions = partitions
        self.runs = runs
        self.due_index = due_index
        self.states = states
        self._metrics = metrics
        self.stats = stats
        self._owned = owned
        self._advertised_url = advertised_url
        self._members = peers.GroupMembers(
            config.kafka, config.settings.group_id, config.topics.proposals
        )
        self.loop: asyncio.AbstractEventLoop | None = None  # the agent's, set by the first request
        self.last_turn = time.monotonic()  # the timers' tick turns it (liveness)
        self.indexed_recoveries = -1  # the table recoveries the indexes were built after

    # -- on the event loop ----------------------------------------------------------
    def _on_loop(self, read: Callable[[], T]) -> T:
        """`read()` run on the event loop, from a request's thread."""

        async def call() -> T:
            return read()

        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(ON_LOOP_TIMEOUT_S)

    def _owned_now(self) -> list[int]:
        """Owned and served: not while a rebalance moves partitions."""
        return [] if self.app.rebalancing else self._owned()

    # -- api.Node -------------------------------------------------------------------
    @property
    def machines(self) -> Mapping[str, Machine]:
        return self.config.machines

    @property
    def partition_count(self) -> int:
        return self.partitions

    @property
    def advertised_url(self) -> str | None:
        return self._advertised_url

    @property
    def http_tokens(self) -> http_auth.HttpTokens:
        return self.config.http_tokens

    @property
    def configured_peers(self) -> tuple[str, ...]:
        return self.config.settings.peers

    def owned(self) -> list[int]:
        return self._on_loop(self._owned_now)

    def run(self, run_id: str, partition: int, *, history: bool) -> api.RunRecord | None:
        def snapshot() -> tuple[bool, RunSnapshot | None]:
            """(owned here, the run's snapshot); a partition whose store is not held
            (not opened yet, or dropped by a stop) is not answered from here."""
            if partition not in self._owned_now() or not self.runs.holds(partition):
                return False, None
            raw = self.runs.partition_get(partition, run_id.encode())
            return True, None if raw is None else RunSnapshot.model_validate_json(raw)

        owned, found = self._on_loop(snapshot)
        if not owned:
            return None
        if found is None or not history:
            return api.RunRecord(found, refusals=None)
        # No history store: the run's partition of the transitions topic, read here, in
        # the request's thread; each revision once, up to the table's snapshot.
        records = read_partition(
            self.config.kafka, self.config.topics.transitions, partition, 0, 60.0
        )
        key = run_id.encode()
        values = (r.value for r in records if r.key == key and r.value is not None)
        return api.RunRecord(found, run_history(values, found.revision), refusals=None)

    def runs_in_state(self, query: peers.StateQuery) -> list[Entered]:
        owned = self._owned_now
        return self._on_loop(lambda: self.states.in_state(self.machines, owned(), query))

    def local_stats(self) -> list[peers.StateStats]:
        return self._on_loop(lambda: self.states.stats(self.machines, self._owned_now()))

    def peers(self) -> list[peers.Peer]:
        return self._members()

    def health(self) -> dict[str, Any]:
        return self._on_loop(
            lambda: {
                "status": "ok",
                "runtime": "faust",
                "group_id": self.config.settings.group_id,
                "partitions": self._owned_now(),
                "stats": dataclasses.asdict(self.stats),
            }
        )

    def loop_idle_seconds(self) -> float:
        return time.monotonic() - self.last_turn

    def waiting(self) -> list[str]:
        return self._on_loop(self._waiting)

    def _waiting(self) -> list[str]:
        """Ready: not rebalancing, the assigned partitions' tables recovered, and their
        in-memory indexes (timers, runs by state) built after that recovery."""
        app = self.app
        if app.rebalancing_count == 0:
            return ["not yet given its partitions by the group"]
        waiting = []
        trouble = cast(Consumer, app.consumer).fetch_trouble()
        if trouble is not None:
            waiting.append(trouble)
        if app.rebalancing:
            waiting.append("rebalancing")
        if app.in_recovery:
            waiting.append("recovering its tables from the changelog")
        if not waiting:
            owned = self._owned()
            unheld = [p for p in owned if not self.runs.holds(p)]
            if unheld:
                waiting.append(f"opening the tables of partitions {unheld}")
            fresh = self.indexed_recoveries == self.runs.recoveries
            unindexed = [p for p in owned if not fresh or not self.due_index.indexed(p)]
            if unindexed:
                waiting.append(f"indexing partitions {unindexed}")
        return waiting

    def metrics(self) -> bytes:
        return self._on_loop(self._metrics.render)


def serve_api(app: faust.App, node: FaustNode) -> None:
    """Every GET path goes to the API, answered in a thread of its own pool: reads may
    wait (for commits under way, for a revision asked), and the loop's default executor,
    a few threads, serves the Kafka clients too."""
    threads = ThreadPoolExecutor(api.MAX_WAITING_READS + 8, thread_name_prefix="runstate-http")

    @app.page("/{path:.*}")
    class Api(View):
        async def get(self, request: Request, path: str = "") -> Response:
            url = request.rel_url
            loop = node.loop = asyncio.get_running_loop()
            authorization = request.headers.get("Authorization")
            answer = await loop.run_in_executor(
                threads, api.answer, node, url.raw_path, url.raw_query_string, authorization
            )
            # aiohttp takes a charset only as a header, not as content_type; a multidict,
            # as a 401 carries two WWW-Authenticate headers
            headers = CIMultiDict([("Content-Type", answer.content_type), *answer.headers])
            return self.bytes(answer.body, status=answer.status, headers=headers)
