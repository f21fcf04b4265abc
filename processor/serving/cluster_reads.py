"""Reads across the cluster: the runs in a state (GET /runs?state=) and the runs per
machine and state (GET /stats), this worker's part and each configured peer's, merged
(peers.py). With local=1, this worker's part only: what a peer asks for."""

import logging
import time
from typing import Any

from processor.serving import peers
from processor.serving.answers import Answer, json_answer
from processor.serving.catch_up import wait_for_fence
from processor.serving.node import Node

log = logging.getLogger("runstate.http")


def runs_in_state(node: Node, params: dict[str, str]) -> Answer:
    if (fenced := wait_for_fence(node)) is not None:
        return fenced
    try:
        found = runs_across(node, params)
    except ValueError as exc:
        return json_answer(400, {"error": str(exc)})
    if isinstance(found, Answer):
        return found
    runs, cursor, missing = found
    return json_answer(200, {"runs": runs, "next": cursor, "missing_partitions": missing})


def runs_across(
    node: Node, params: dict[str, str]
) -> Answer | tuple[list[dict[str, Any]], str | None, list[int]]:
    """The runs in `params`' state across the cluster, a page of them (or, with local=1,
    this worker's part as the answer); ValueError for parameters that are no query."""
    state = params.get("state") or None
    order = params.get("order", "longest")
    if order not in ("longest", "newest"):
        raise ValueError("order is longest (longest in the state first) or newest")
    newest = order == "newest"
    if state is None and not newest:
        raise ValueError("give a state: /runs?state=paused[&machine=...], or order=newest")
    limit = int(params.get("limit", "100"))
    if not 1 <= limit <= 1000:
        raise ValueError("limit must be 1 to 1000")
    after = peers.parse_cursor(params.get("after"))
    now_ms = int(time.time() * 1000)
    local = [
        {
            "run_id": r.run_id,
            "machine": r.machine,
            "state": r.state,
            "entered_state_at_ms": r.entered_ms,
            "time_in_state_ms": max(0, now_ms - r.entered_ms),
        }
        for r in node.runs_in_state(
            peers.StateQuery(params.get("machine"), state, after, limit, newest)
        )
    ]
    if params.get("local") == "1":
        return json_answer(200, {"items": local, "partitions": node.owned(), "order": order})
    pages, missing = _cluster(node, "/runs", params, local, order)
    runs, cursor = peers.merge_runs(pages, limit, newest)
    return runs, cursor, missing


def state_stats(node: Node, params: dict[str, str]) -> Answer:
    if (fenced := wait_for_fence(node)) is not None:
        return fenced
    if params.get("local") == "1":
        return json_answer(200, {"items": _local_stats(node), "partitions": node.owned()})
    states, missing = stats_across(node, params)
    return json_answer(200, {"states": states, "missing_partitions": missing})


def _local_stats(node: Node) -> list[dict[str, Any]]:
    return [
        {"machine": m, "state": s, "runs": n, "oldest_entered_ms": oldest}
        for m, s, n, oldest in node.local_stats()
    ]


def stats_across(node: Node, params: dict[str, str]) -> tuple[list[dict[str, Any]], list[int]]:
    """Runs per machine and state across the cluster, and the partitions missing."""
    pages, missing = _cluster(node, "/stats", params, _local_stats(node))
    return peers.merge_stats(pages), missing


def _cluster(
    node: Node, path: str, params: dict[str, str], local: Any, order: str | None = None
) -> tuple[list[Any], list[int]]:
    """This worker's answer and every other worker's; with the partitions whose owners
    did not answer, or answered in another `order` than asked (a worker of a version
    that does not know it answers in its own: its page would not merge)."""
    pages, covered = [local], set(node.owned())
    url = node.advertised_url
    asked = {peers.origin_or_none(url)}  # itself, then each peer once
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
        if order is not None and answered.get("order", "longest") != order:
            log.warning("%s answered %s in another order than %s", target, path, order)
            continue
        pages.append(answered["items"])
        covered |= set(answered["partitions"])
    missing = sorted(set(range(node.partition_count)) - covered)
    return pages, missing
