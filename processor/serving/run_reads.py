"""Reads of one run: its snapshot (GET /runs/<run_id>), its history
(GET /runs/<run_id>/history) and its inspector page (GET /inspect?run=<run_id>). The
worker that owns the run's partition answers; any other asks the owner when it is a
configured peer and passes its answer on (a browser is redirected there), so one URL of
a cluster serves every run."""

import json
import logging
import threading
import time
from urllib.parse import quote

from processor.kafka.partitioning import partition_for
from processor.serving import inspector, peers
from processor.serving.answers import JSON, Answer, html_answer, json_answer
from processor.serving.catch_up import CATCH_UP_S, caught_up, wait_for_fence
from processor.serving.graphviz import laid_out
from processor.serving.node import Node, RunRecord

log = logging.getLogger("runstate.http")

#: How long a forwarded read may take: the owner's own waits for fresh state (its read
#: fence, then the revision asked for), and a second; a reader waits longer (15 s).
FORWARD_S = 2 * CATCH_UP_S + 1
#: Reads forwarded at once: past this a read is answered 503 at once, so forwards
#: (each a server thread waiting on a peer) never take every thread, probes' included.
MAX_FORWARDS = 8
_FORWARDING = threading.BoundedSemaphore(MAX_FORWARDS)


def _partition(node: Node, run_id: str) -> int:
    count = node.partition_count
    return partition_for(run_id, count) if count else 0


def _owner(node: Node, partition: int) -> tuple[peers.Peer | None, str | None]:
    """The group member that claims `partition` (None: none known now), and the
    configured peer it is (None: itself, or no configured peer: not asked)."""
    try:
        members = node.peers()
    except Exception as exc:  # the broker away: no owner known now
        log.warning("the consumer group could not be described: %s", exc)
        return None, None
    claimed = next((p for p in members if partition in p.partitions), None)
    if claimed is None or claimed.url == node.advertised_url:
        return claimed, None
    owner = peers.configured_peer(claimed.url, node.configured_peers)
    if owner is None:
        log.warning("%s", peers.unconfigured(claimed))
    elif owner == peers.origin_or_none(node.advertised_url):
        return claimed, None
    return claimed, owner


def _from_owner(
    node: Node, run_id: str, partition: int, params: dict[str, str], history: bool
) -> Answer:
    """A read of a run this worker does not own: the owner's answer when it is a
    configured peer (asked once, with this worker's token), else 421 naming the owner
    when one claims the partition."""
    claimed, owner = _owner(node, partition)
    if owner is not None and params.get(peers.FORWARDED) != "1":
        if not _FORWARDING.acquire(blocking=False):
            return json_answer(
                503,
                {
                    "error": f"run '{run_id}' is owned by {owner}, and {MAX_FORWARDS} reads "
                    "are being passed to their owners already: ask again, or ask the owner",
                    "partition": partition,
                    "owner": owner,
                },
            )
        path = f"/runs/{quote(run_id, safe='')}" + ("/history" if history else "")
        try:
            forwarded = {**params, peers.FORWARDED: "1"}
            got = peers.fetch(owner, path, forwarded, node.http_tokens.first(), FORWARD_S)
        except OSError as exc:
            return json_answer(
                503,
                {
                    "error": f"run '{run_id}' lives in partition {partition}, owned by "
                    f"{owner}, which did not answer ({exc}): ask again",
                    "partition": partition,
                    "owner": owner,
                },
            )
        finally:
            _FORWARDING.release()
        return Answer(got.status, got.content_type, got.body)
    error = (
        f"run '{run_id}' lives in partition {partition}, which this worker does not own; "
        "ask the worker that does"
    )
    body: dict[str, object] = {"partition": partition}
    itself = claimed is not None and peers.origin_or_none(claimed.url) == peers.origin_or_none(
        node.advertised_url
    )
    if claimed is not None and not itself:
        body["owner"] = claimed.url
        if owner is None:
            error += f" ({claimed.url}, not among this worker's --peer URLs)"
    body["error"] = error
    return json_answer(421, body)


def inspector_page(node: Node, run_id: str) -> Answer:
    now_ms = int(time.time() * 1000)
    partition = _partition(node, run_id)
    if partition in node.owned() and (fenced := wait_for_fence(node)) is not None:  # read it fresh
        return fenced
    record = node.run(run_id, partition, history=True)
    if record is None:
        _, owner = _owner(node, partition)
        # A browser is sent to a configured peer only, never to an advertised address.
        if owner is not None:
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
    layout = laid_out(machine) if machine is not None else None
    page = inspector.page(
        run_id, machine, snapshot, record.history, record.refusals, now_ms, layout=layout
    )
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
        return _from_owner(node, run_id, partition, params, history)
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
