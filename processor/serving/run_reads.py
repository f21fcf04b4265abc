"""Reads of one run, from the worker that owns its partition: its snapshot
(GET /runs/<run_id>), its history (GET /runs/<run_id>/history) and its inspector page
(GET /inspect?run=<run_id>, else a redirect to the configured peer that owns it)."""

import json
import logging
import time
from urllib.parse import quote

from processor.kafka.partitioning import partition_for
from processor.serving import inspector, peers
from processor.serving.answers import JSON, Answer, html_answer, json_answer
from processor.serving.catch_up import caught_up, wait_for_fence
from processor.serving.node import Node, RunRecord

log = logging.getLogger("runstate.http")


def _partition(node: Node, run_id: str) -> int:
    count = node.partition_count
    return partition_for(run_id, count) if count else 0


def inspector_page(node: Node, run_id: str) -> Answer:
    now_ms = int(time.time() * 1000)
    if not run_id:
        return html_answer(200, inspector.page("", None, None, [], [], now_ms))
    partition = _partition(node, run_id)
    if partition in node.owned() and (fenced := wait_for_fence(node)) is not None:  # read it fresh
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
        if owner is not None and owner != peers.origin_or_none(node.advertised_url):
            location = f"{owner}/inspect?run={quote(run_id, safe='')}"
            return Answer(307, "text/plain", b"", (("Location", location),))
        problem = (
            f"Run '{run_id}' lives in partition {partition}, whose owner is not known now "
            "(or is not among this worker's configured peers, --peer)."
        )
        return html_answer(503, inspector.page(run_id, None, None, [], [], now_ms, problem))
    snapshot = record.snapshot
    machine = node.machines.get(snapshot.machine) if snapshot is not None else None
    status = 200 if snapshot is not None else 404
    page = inspector.page(run_id, machine, snapshot, record.history, record.refusals, now_ms)
    return html_answer(status, page)


def read_run(node: Node, run_id: str, params: dict[str, str], history: bool) -> Answer:
    partition = _partition(node, run_id)
    wanted: list[int | None] = []
    for name in ("min_revision", "at_ms"):
        value = params.get(name)
        if value is not None and not (value.isdigit() and value.isascii()):
            return json_answer(400, {"error": f"{name} must be a whole number, not {value!r}"})
        wanted.append(None if value is None else int(value))
    revision, at_ms = wanted
    # Not owned here: said at once (a stuck commit of this worker is not the reader's).
    record: RunRecord | None = None
    if partition in node.owned():
        if (fenced := wait_for_fence(node)) is not None:
            return fenced
        found = caught_up(node, run_id, partition, revision, at_ms)
        if isinstance(found, Answer):
            return found
        record = found
    if record is None:
        return json_answer(
            421,
            {
                "error": f"run '{run_id}' lives in partition {partition}, which this "
                "worker does not own; ask the worker that does",
                "partition": partition,
            },
        )
    if record.snapshot is None:
        return json_answer(404, {"error": f"no run '{run_id}'", "partition": partition})
    if not history:
        return Answer(200, JSON, record.snapshot.model_dump_json().encode())
    with_history = node.run(run_id, partition, history=True)
    if with_history is None:
        return json_answer(503, {"error": f"run '{run_id}' moved while read: ask again"})
    if with_history.snapshot is None:  # forgotten since
        return json_answer(404, {"error": f"no run '{run_id}'", "partition": partition})
    return json_answer(200, [json.loads(t.model_dump_json()) for t in with_history.history])
