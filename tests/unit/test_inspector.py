"""The run inspector page, rendered from a run's data (no worker, no browser)."""

import re

from processor.machines import builtin_machines
from processor.serving.inspector import page
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


def test_page_without_a_run_is_a_search_box() -> None:
    html = page("", None, None, [], [], 0)
    assert '<input name="run"' in html and "<svg" not in html
    missing = page("nope", None, None, [], [], 0)
    assert "No run &#x27;nope&#x27;" in missing
