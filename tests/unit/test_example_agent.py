"""The example agent (examples/agent/task_agent.py), tested as its author would: against
the in-process test environment, in milliseconds. (The integration test runs it as a
process on a real broker, crash included.)"""

import asyncio
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from processor.testing import RunstateEnvironment

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).parents[2] / "examples" / "agent" / "task_agent.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("task_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_agent_does_each_step_once_and_completes(capsys: pytest.CaptureFixture[str]) -> None:
    agent = _example()
    env = RunstateEnvironment()
    asyncio.run(agent.live(env.client(), "order-1", None))
    said = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [s["event"] for s in said] == ["started", *["step_done"] * 3, "completed"]
    snapshot = env.snapshot("order-1")
    assert snapshot is not None and snapshot.state == "done"
    assert {name: s.status.value for name, s in snapshot.steps.items()} == {
        "validate": "succeeded",
        "refund": "succeeded",
        "notify": "succeeded",
    }


def test_the_agent_resumes_after_a_crash_mid_step(capsys: pytest.CaptureFixture[str]) -> None:
    """A first life that died while `refund` ran: the resumed agent keeps `validate`'s
    result, settles `refund` as not done and runs it again under the same key."""
    agent = _example()
    env = RunstateEnvironment()
    client = env.blocking_client()
    client.create_and_wait("order-2", agent.MACHINE, raise_on_rejection=True)
    client.propose_and_wait("order-2", "start", raise_on_rejection=True)
    client.propose_and_wait(
        "order-2",
        "checkpoint",
        payload={"data": {"order": "order-2", "plan": list(agent.STEPS)}},
        raise_on_rejection=True,
    )
    with client.step("order-2", "validate", key="order-2:validate") as step:
        step.result = {"order": "order-2", "amount_cents": 1250}
    client.propose_and_wait(
        "order-2",
        "step_started",
        payload={"step": "refund", "idempotency_key": "order-2:refund"},
        raise_on_rejection=True,
    )
    asyncio.run(agent.live(env.client(), "order-2", None))
    said = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert said[0]["event"] == "resumed" and said[0]["executing"] == ["refund"]
    assert [s.get("step") for s in said if s["event"] == "step_done"] == ["refund", "notify"]
    assert said[-1]["event"] == "completed"
    events = [(t.event, t.payload.get("step")) for t in env.history("order-2")]
    assert events.count(("step_started", "validate")) == 1
    assert ("step_failed", "refund") in events
    assert events.count(("step_started", "refund")) == 2
