"""The run inspector page, rendered from a run's data (no worker, no browser)."""

import re

from processor.machines import builtin_machines
from processor.serving.inspector import landing, page, state_runs
from tests.unit.driver import APPROVER, Driver


def test_page_draws_the_machine_with_the_path_taken_and_the_current_state() -> None:
    run = Driver(run_id="r<1>")  # escaped, not markup
    run.create("task_lifecycle", max_retries=1)
    run.commit("start")
    run.commit("pause_for_approval")
    refused = run.refuse("complete")  # not allowed while paused
    run.commit("approval_granted", APPROVER, payload=run.decision())
    assert run.snapshot is not None
    machine = builtin_machines()["task_lifecycle"]
    html = page("r<1>", machine, run.snapshot, run.history, [refused], run.now)

    assert "r&lt;1&gt;" in html and "r<1>" not in html
    current = re.findall(r'<g class="([^"]+)" data-state="([^"]+)"', html)
    assert [s for cls, s in current if "current" in cls.split()] == ["running"]
    assert {s for cls, s in current if "visited" in cls.split()} == {"planned", "running", "paused"}
    assert len(current) == len(machine.spec.states)  # every state drawn
    taken = set(re.findall(r'<path class="edge taken"[^>]*data-edge="([^"]+)"', html))
    assert taken == {"planned:start", "running:pause_for_approval", "paused:approval_granted"}
    assert html.count('<tr class="transition"') == len(run.history) == 4
    assert html.count('<tr class="refused"') == 1 and "invalid_transition" in html
    assert 'id="deadlines"' in html  # running arms the running-too-long alert


def test_a_run_not_there_is_said() -> None:
    missing = page("nope", None, None, [], [], 0)
    assert "No run &#x27;nope&#x27;" in missing and '<input name="run"' in missing


def test_the_landing_page_counts_runs_by_state_and_links_each_state() -> None:
    states = [
        {"machine": "m", "state": "paused", "runs": 3, "oldest_entered_ms": 1_000},
        {"machine": "m", "state": "done <b>", "runs": 0, "oldest_entered_ms": None},
    ]
    recent = [
        {"run_id": "a/b <c>", "machine": "m", "state": "paused", "entered_state_at_ms": 1_000}
    ]
    html = landing(states, recent, [2], 61_000)
    assert '<a href="/inspect?state=paused&amp;machine=m">paused</a>' in html
    assert '<table id="recent">' in html and "1m 00s ago" in html
    assert '<a href="/inspect?run=a%2Fb+%3Cc%3E">a/b &lt;c&gt;</a>' in html
    assert "<td>3</td><td>1m 00s</td>" in html
    assert "done &lt;b&gt;" in html and "state=done" not in html  # no runs: no link
    assert 'id="missing"' in html and "[2]" in html
    assert "No runs yet." in landing([], [], [], 0) and "No changes yet." in landing([], [], [], 0)


def test_a_states_page_lists_its_runs_with_links_and_the_next_page() -> None:
    runs = [
        {
            "run_id": "a/b <c>",
            "machine": "m",
            "state": "paused",
            "entered_state_at_ms": 0,
            "time_in_state_ms": 5_000,
        }
    ]
    html = state_runs("m", "paused", runs, "0:a/b <c>", [])
    assert '<a href="/inspect?run=a%2Fb+%3Cc%3E">a/b &lt;c&gt;</a>' in html
    assert (
        'id="more" href="/inspect?state=paused&amp;after=0%3Aa%2Fb+%3Cc%3E&amp;machine=m"' in html
    )
    refused = state_runs(None, "paused", [], None, [], "limit must be 1 to 1000")
    assert 'id="problem">limit must be 1 to 1000<' in refused


def test_step_results_show_as_json() -> None:
    from processor.serving.inspector import _outcome

    assert _outcome(None, {"ok": True, "n": None}) == '{"ok": true, "n": null}'
    assert _outcome("boom", None) == "boom" and _outcome(None, None) == ""
