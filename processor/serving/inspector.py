"""The run inspector: server-rendered HTML. Its landing page (GET /inspect) counts the
runs of every machine by state across the cluster; a state's page (GET
/inspect?state=S[&machine=M]) lists its runs, longest there first; a run's page (GET
/inspect?run=<run_id>) shows the run. The landing page also lists the recent changes,
the runs that entered their state last.

The run's machine is drawn as a state diagram (diagram.py: laid out by Graphviz where it
is installed), with the path the run took and the state it is in now; below it,
the transition timeline (who proposed what, when, and the refusals, where the runtime
keeps them: the Faust runtime does not), the step ledger and the deadlines. Pure: data
in, HTML out; no script, no external assets (the page works where no CDN is reachable)."""

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import urlencode

from processor.engine import Machine
from processor.serving.diagram import FONT, Layout, columns, svg
from processor.times import duration
from schemas.messages import Rejection, RunSnapshot, Transition

_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #1f2328; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
form input { font: inherit; padding: 4px 8px; width: 280px; }
table { border-collapse: collapse; margin-top: 8px; }
th, td { border-bottom: 1px solid #d0d7de; padding: 4px 10px; text-align: left;
         vertical-align: top; }
tr.refused td { color: #9a2617; }
.muted { color: #656d76; }
svg .state rect { fill: #f6f8fa; stroke: #8c959f; stroke-width: 1.5; }
svg .state.visited rect { fill: #ddf4ff; stroke: #0969da; }
svg .state.current rect { fill: #0969da; stroke: #0550ae; stroke-width: 3; }
svg .state.current text { fill: #ffffff; font-weight: 600; }
svg .state text { font: 13px $FONT; }
svg .edge { stroke: #afb8c1; stroke-width: 1.2; fill: none; }
svg .edge.taken { stroke: #0969da; stroke-width: 2.5; }
svg text.label { font: 11px $FONT; fill: #656d76; }
svg text.label.taken { fill: #0550ae; font-weight: 600; }
svg .state.current text.label { fill: #ffffff; }
svg .state.current path.edge { stroke: #ffffff; }
""".replace("$FONT", FONT)


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _duration(ms: int) -> str:
    return duration(ms, " ")


def _timeline(history: Sequence[Transition], refusals: Sequence[Rejection]) -> str:
    rows: list[tuple[int, int, str]] = []
    for t in history:
        reason = f" ({escape(t.reason)})" if t.reason else ""
        rows.append(
            (
                t.at_ms,
                0,
                f'<tr class="transition" data-revision="{t.revision}"><td>{_time(t.at_ms)}</td>'
                f"<td>{t.revision}</td><td>{escape(t.event)}{reason}</td>"
                f"<td>{escape(t.from_state or '-')} &rarr; {escape(t.to_state)}</td>"
                f"<td>{escape(t.principal.source)} ({escape(t.principal.authority)})</td>"
                f"<td class=muted>{escape(t.proposal_id)}</td></tr>",
            )
        )
    for r in refusals:
        rows.append(
            (
                r.at_ms,
                1,
                f'<tr class="refused"><td>{_time(r.at_ms)}</td><td>refused</td>'
                f"<td>{escape(r.event or '-')}</td><td>{escape(r.code.value)}: "
                f"{escape(r.detail)}</td><td>"
                f"{escape(r.principal.source) if r.principal else '-'}</td>"
                f"<td class=muted>{escape(r.proposal_id or '-')}</td></tr>",
            )
        )
    body = "".join(row for _, _, row in sorted(rows, key=lambda x: (x[0], x[1])))
    return (
        '<table id="timeline"><tr><th>time (UTC)</th><th>revision</th><th>event</th>'
        "<th>state</th><th>proposed by</th><th>proposal</th></tr>" + body + "</table>"
    )


def _outcome(error: str | None, result: object) -> str:
    """An error as written, a result as JSON (what the wire holds, not Python's repr)."""
    if error:
        return error
    return "" if result is None else json.dumps(result, ensure_ascii=False)


def _steps(snapshot: RunSnapshot) -> str:
    if not snapshot.steps:
        return '<p class="muted">No steps recorded.</p>'
    rows = "".join(
        f"<tr><td>{escape(name)}</td><td>{escape(step.status.value)}</td>"
        f"<td>{step.attempts}</td><td>{escape(step.idempotency_key or '-')}</td>"
        f"<td>{escape(_outcome(step.error, step.result))}</td><td>{step.revision}</td></tr>"
        for name, step in sorted(snapshot.steps.items())
    )
    return (
        '<table id="steps"><tr><th>step</th><th>status</th><th>attempts</th>'
        "<th>idempotency key</th><th>result / error</th><th>revision</th></tr>" + rows + "</table>"
    )


def _deadlines(snapshot: RunSnapshot, now_ms: int) -> str:
    if not snapshot.timers:
        return '<p class="muted">No deadlines or alerts armed.</p>'
    rows = "".join(
        f"<tr><td>{escape(t.kind)}</td><td>{escape(t.name)}</td><td>{_time(t.due_at_ms)}</td>"
        f"<td>{'due' if t.due_at_ms <= now_ms else 'in ' + _duration(t.due_at_ms - now_ms)}</td>"
        f"<td>{escape(t.event or '-')}</td></tr>"
        for t in sorted(snapshot.timers, key=lambda t: t.due_at_ms)
    )
    return (
        '<table id="deadlines"><tr><th>kind</th><th>name</th><th>due (UTC)</th><th></th>'
        "<th>proposes</th></tr>" + rows + "</table>"
    )


def _head(title: str, run_id: str = "") -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>runstate: {escape(title)}</title><style>{_STYLE}</style></head>"
        '<body><nav><a href="/inspect">all runs</a></nav>'
        '<form method="get" action="/inspect"><label>Run <input name="run" '
        f'value="{escape(run_id)}" placeholder="run id" autofocus></label> '
        "<button>Inspect</button></form>"
    )


def _missing(missing: Sequence[int]) -> str:
    if not missing:
        return ""
    return (
        f'<p id="missing" class="muted">Partitions {list(missing)} did not answer (their '
        "workers are down, rebalancing, or no configured peer): their runs are not counted."
        "</p>"
    )


def landing(
    states: Sequence[dict[str, Any]],
    recent: Sequence[dict[str, Any]],
    missing: Sequence[int],
    now_ms: int,
) -> str:
    """Where the inspector starts: the runs of every machine by state, across the
    cluster, how long the oldest has been there, each state a link to its runs; and the
    recent changes, the runs that entered their state last, each a link to its page."""
    rows = []
    for row in states:
        machine, state, runs = row["machine"], row["state"], row["runs"]
        oldest = row["oldest_entered_ms"]
        link = f"/inspect?{urlencode({'state': state, 'machine': machine})}"
        named = f'<a href="{escape(link)}">{escape(state)}</a>' if runs else escape(state)
        waited = "" if oldest is None else _duration(max(0, now_ms - oldest))
        rows.append(
            f"<tr><td>{escape(machine)}</td><td>{named}</td><td>{runs:,}</td><td>{waited}</td></tr>"
        )
    table = (
        '<table id="states"><tr><th>machine</th><th>state</th><th>runs</th>'
        "<th>longest there</th></tr>" + "".join(rows) + "</table>"
        if rows
        else '<p class="muted">No runs yet.</p>'
    )
    changes = "".join(
        f'<tr><td><a href="/inspect?{escape(urlencode({"run": r["run_id"]}))}">'
        f"{escape(r['run_id'])}</a></td><td>{escape(r['machine'])}</td>"
        f"<td>{escape(r['state'])}</td><td>{_time(r['entered_state_at_ms'])}</td>"
        f"<td>{_duration(max(0, now_ms - r['entered_state_at_ms']))} ago</td></tr>"
        for r in recent
    )
    changed = (
        '<table id="recent"><tr><th>run</th><th>machine</th><th>entered</th>'
        "<th>at (UTC)</th><th>since</th></tr>" + changes + "</table>"
        if changes
        else '<p class="muted">No changes yet.</p>'
    )
    return (
        _head("runs")
        + "<h1>Runs by state</h1>"
        + _missing(missing)
        + table
        + "<h2>Recent changes</h2>"
        + changed
        + "</body></html>"
    )


def state_runs(
    machine: str | None,
    state: str,
    runs: Sequence[dict[str, Any]],
    cursor: str | None,
    missing: Sequence[int],
    problem: str | None = None,
) -> str:
    """The runs in `state` (of `machine`), longest there first, each a link to its page;
    or the `problem` with the query."""
    rows = "".join(
        f'<tr><td><a href="/inspect?{escape(urlencode({"run": r["run_id"]}))}">'
        f"{escape(r['run_id'])}</a></td><td>{escape(r['machine'])}</td>"
        f"<td>{_time(r['entered_state_at_ms'])}</td>"
        f"<td>{_duration(r['time_in_state_ms'])}</td></tr>"
        for r in runs
    )
    title = f"{machine + ': ' if machine else ''}{state}"
    more = ""
    if cursor is not None:
        query = {"state": state, "after": cursor, **({"machine": machine} if machine else {})}
        more = f'<p><a id="more" href="/inspect?{escape(urlencode(query))}">more</a></p>'
    table = (
        '<table id="runs"><tr><th>run</th><th>machine</th><th>entered (UTC)</th>'
        "<th>there for</th></tr>" + rows + "</table>"
        if rows
        else '<p class="muted">No runs in this state.</p>'
    )
    if problem is not None:
        table, more = f'<p id="problem">{escape(problem)}</p>', ""
    return (
        _head(title)
        + f"<h1>Runs in {escape(title)}</h1>"
        + _missing(missing)
        + table
        + more
        + "</body></html>"
    )


def page(
    run_id: str,
    machine: Machine | None,
    snapshot: RunSnapshot | None,
    history: Sequence[Transition],
    refusals: Sequence[Rejection] | None,
    now_ms: int,
    problem: str | None = None,
    layout: Layout | None = None,
) -> str:
    """The inspector page for `run_id`, its diagram drawn in `layout` (the machine's
    columns when None); `refusals` None: this worker keeps none, and the page says so."""
    head = _head(run_id or "inspector", run_id)
    if problem is not None or snapshot is None or machine is None:
        why = problem or f"No run '{run_id}'."
        return head + f'<p id="problem">{escape(why)}</p></body></html>'
    in_state = _duration(now_ms - snapshot.entered_state_at_ms)
    counted = (
        f"{len(refusals)} refusals"
        if refusals is not None
        else '<span id="no-refusals">refusals not shown: this worker keeps none (they are '
        "on the rejections topic)</span>"
    )
    summary = (
        f"<h1>{escape(run_id)}</h1><p>machine <b>{escape(machine.name)}</b>, now "
        f'<b id="current-state">{escape(snapshot.state)}</b> for {in_state}, revision '
        f"{snapshot.revision}, retries {snapshot.retry_count} of {snapshot.max_retries}"
        + (f", stopped: {escape(snapshot.stop_reason)}" if snapshot.stop_reason else "")
        + "</p>"
    )
    return (
        head
        + summary
        + "<h2>Machine</h2>"
        + svg(machine, layout or columns(machine), history, snapshot.state)
        + f"<h2>Timeline</h2><p class=muted>{len(history)} transitions, {counted}</p>"
        + _timeline(history, refusals or ())
        + "<h2>Step ledger</h2>"
        + _steps(snapshot)
        + "<h2>Deadlines</h2>"
        + _deadlines(snapshot, now_ms)
        + "</body></html>"
    )
