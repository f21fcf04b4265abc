"""What the HTTP API (processor/serving/api.py) asks a native worker: its `Node`. Called from
the server's threads while the worker's loop runs: stores are read under the registry's
lock, and only what a transaction committed is ever seen."""

import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from processor.engine import Machine
from processor.runtimes.native.store.indexes import InState
from processor.runtimes.native.worker import Worker
from processor.serving import peers
from processor.serving.node import RunRecord
from processor.serving.read_fence import ReadFence
from processor.trust.http_auth import HttpTokens


class WorkerQueries:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        config = worker.config
        self._members = peers.GroupMembers(
            config.kafka, config.settings.group_id, config.topics.proposals
        )

    @property
    def machines(self) -> Mapping[str, Machine]:
        return self.worker.config.machines

    @property
    def partition_count(self) -> int:
        return self.worker.partitions

    @property
    def advertised_url(self) -> str | None:
        return self.worker.advertised_url

    @property
    def http_tokens(self) -> HttpTokens:
        return self.worker.config.http_tokens

    @property
    def configured_peers(self) -> tuple[str, ...]:
        return self.worker.config.settings.peers

    @property
    def read_fence(self) -> ReadFence:
        return self.worker.read_fence

    def owned(self) -> list[int]:
        return self.worker.stores.owned()

    def run(self, run_id: str, partition: int, *, history: bool) -> RunRecord | None:
        with self.worker.stores.reading(partition) as store:
            if store is None:
                return None
            snapshot = store.committed_snapshot(run_id)
            if snapshot is None or not history:
                return RunRecord(snapshot)
            return RunRecord(snapshot, store.history(run_id), store.refusals(run_id))

    def runs_in_state(self, query: peers.StateQuery) -> list[InState]:
        return self.worker.stores.runs_in_state(self.machines, query)

    def local_stats(self) -> list[peers.StateStats]:
        return self.worker.stores.local_stats(self.machines)

    def peers(self) -> list[peers.Peer]:
        """The group's workers and what they own, from the group's description."""
        return self._members()

    def health(self) -> dict[str, Any]:
        worker = self.worker
        return {
            "status": "ok",
            "worker_id": worker.worker_id,
            "group_id": worker.config.settings.group_id,
            "partitions": worker.stores.owned(),
            "stats": asdict(worker.stats),
        }

    def loop_idle_seconds(self) -> float:
        return time.monotonic() - self.worker.last_turn

    def waiting(self) -> list[str]:
        """Ready: in the group, every assigned partition restored, clients healthy."""
        worker = self.worker
        waiting = []
        if not worker.assigned:
            waiting.append("not yet given its partitions by the group")
        if worker.restoring:
            waiting.append(f"restoring partitions {worker.restoring}")
        if worker.broken:
            waiting.append("its Kafka clients failed; restarting")
        return waiting

    def metrics(self) -> bytes:
        return self.worker.metrics.render()
