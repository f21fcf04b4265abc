"""A worker's HTTP API, whichever its runtime, written once: this module routes each GET
to what answers it (probes.py, cluster_reads.py, run_reads.py; the waits for fresh state
in catch_up.py, the answers' shapes in answers.py). A runtime implements `Node`
(node.py: what it knows) and its server hands each GET's path and query string to
`answer`, which may block (peers are asked over HTTP, a Faust worker reads a topic for a
history): run it in a thread.

When the worker has tokens, every endpoint but /livez wants one (the rule, its headers
and its words are processor/trust/http_auth.py's); without, a 401 with WWW-Authenticate.

GET /health                  the runtime's identity, owned partitions, counters
GET /livez                   200 while the worker's loop turns, else 503 (restart it)
GET /readyz                  200 when the worker is in its group with every assigned
                             partition's state ready to serve, else 503 with what it
                             waits for (each runtime says what that means: `Node.waiting`)
GET /metrics                 Prometheus metrics (processor/observe/metrics.py)
GET /runs?state=S[&machine=M][&limit=N][&after=CURSOR][&order=newest]
                             runs in a state across the cluster, longest there first
                             (order=newest: the latest to enter first; without a
                             state, in any state: the cluster's recent changes;
                             local=1: this worker's partitions only)
GET /stats                   runs per machine and state across the cluster, and the
                             oldest entry in each (local=1: this worker's only)
GET /inspect                 the inspector (HTML): the runs by machine and state across
                             the cluster; ?state=S[&machine=M] their runs; ?run=<run_id>
                             a run's page (redirected to its owner when that is a
                             configured peer)
GET /runs/<run_id>           the run's committed snapshot (404 unknown); a run owned
                             elsewhere is asked of its owner when that is a configured
                             peer (run_reads.py), else 421 naming it
GET /runs/<run_id>/history   the run's transitions, oldest first
    [?min_revision=N[&at_ms=T]]
                             read your writes: wait (up to CATCH_UP_S) until this worker
                             has applied the run's transition N, committed at broker
                             time T, else 503; a client that saw it sends both
Only committed state is served: what the runtime made durable, never staged changes;
and a read of runs waits (up to CATCH_UP_S, else 503) for the writes already under way
when it came, so it shows every transition committed before it (read_fence.py).
"""

import json
from urllib.parse import parse_qs, unquote

from prometheus_client import CONTENT_TYPE_LATEST

from processor.serving.answers import JSON, Answer, json_answer
from processor.serving.catch_up import MAX_WAITING_READS
from processor.serving.cluster_reads import runs_in_state, state_stats
from processor.serving.node import Node, RunRecord
from processor.serving.overview import overview
from processor.serving.probes import livez, readyz
from processor.serving.run_reads import read_run
from processor.trust import http_auth

# A runtime needs this module only: it implements `Node` (each run as a `RunRecord`),
# sizes its server's threads by MAX_WAITING_READS and hands each GET to `answer`.
__all__ = ["MAX_WAITING_READS", "Answer", "Node", "RunRecord", "answer"]

ENDPOINTS = (
    "no such endpoint; try /health, /livez, /readyz, /metrics, /stats, "
    "/runs?state=..., /runs/<run_id>[/history]"
)


def answer(node: Node, path: str, query: str, authorization: str | None = None) -> Answer:
    """The answer to GET `path`?`query` (both as sent: percent-encoded), asked with
    `authorization` (the request's Authorization header, if any)."""
    parts = [unquote(p) for p in path.strip("/").split("/")]
    refused = http_auth.refusal(node.http_tokens, "/".join(parts), authorization)
    if refused is not None:
        body = json.dumps({"error": refused}).encode()
        return Answer(401, JSON, body, http_auth.CHALLENGES)
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    if parts == ["runs"]:
        return runs_in_state(node, params)
    if parts == ["stats"]:
        return state_stats(node, params)
    if parts == ["inspect"] or parts == [""]:
        return overview(node, params)
    if parts == ["health"]:
        return json_answer(200, node.health())
    if parts == ["livez"]:
        return livez(node)
    if parts == ["readyz"]:
        return readyz(node)
    if parts == ["metrics"]:
        return Answer(200, CONTENT_TYPE_LATEST, node.metrics())
    if len(parts) == 2 and parts[0] == "runs":
        return read_run(node, parts[1], params, history=False)
    if len(parts) == 3 and parts[0] == "runs" and parts[2] == "history":
        return read_run(node, parts[1], params, history=True)
    return json_answer(404, {"error": ENDPOINTS})
