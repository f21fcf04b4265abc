"""The inspector's pages (GET /inspect, and / too): with ?run= a run's page
(run_reads.py); with ?state= the runs in that state; else the landing page, the runs of
every machine by state and the recent changes (the runs that entered their state last).
Every list is the cluster's (cluster_reads.py)."""

import time

from processor.serving import inspector
from processor.serving.answers import Answer, html_answer
from processor.serving.catch_up import wait_for_fence
from processor.serving.cluster_reads import runs_across, stats_across
from processor.serving.node import Node
from processor.serving.run_reads import inspector_page

#: Runs a state's page lists at once (a link leads to the next).
PAGE = 50
#: The recent changes the landing page lists: the runs that entered their state last.
RECENT = 20


def overview(node: Node, params: dict[str, str]) -> Answer:
    run_id = params.get("run", "").strip()
    if run_id:
        return inspector_page(node, run_id)
    if (fenced := wait_for_fence(node)) is not None:
        return fenced
    state = params.get("state", "").strip()
    if not state:
        states, missing = stats_across(node, {})
        found = runs_across(node, {"order": "newest", "limit": str(RECENT)})
        recent, missing_too = (found[0], found[2]) if isinstance(found, tuple) else ([], [])
        missing = sorted(set(missing) | set(missing_too))
        now_ms = int(time.time() * 1000)
        return html_answer(200, inspector.landing(states, recent, missing, now_ms))
    machine = params.get("machine") or None
    query = {"state": state, "limit": str(PAGE)}
    for name, value in (("machine", machine), ("after", params.get("after"))):
        if value:
            query[name] = value
    try:
        found = runs_across(node, query)
    except ValueError as exc:
        return html_answer(400, inspector.state_runs(machine, state, [], None, [], str(exc)))
    if isinstance(found, Answer):  # (a local=1 query: not this page's)
        return found
    runs, cursor, missing = found
    return html_answer(200, inspector.state_runs(machine, state, runs, cursor, missing))
