"""The test environment as an agent developer uses it: the SDK's clients, the workers'
rules (signatures, authority, dedupe, steps, approvals), and deadlines fired by moving
a clock, in milliseconds of real time and with no broker."""

import asyncio
import time
from typing import Any

import pytest

from processor.client import (
    AsyncWatch,
    NotServed,
    Rejected,
    Rejection,
    RejectionCode,
    Transition,
)
from processor.testing import RunstateEnvironment

pytestmark = pytest.mark.unit

M = "task_lifecycle"


def test_an_unanswered_approval_times_out_when_the_clock_moves() -> None:
    async def main() -> None:
        env = RunstateEnvironment()
        agent = env.client()
        await agent.create_and_wait("r1", M, raise_on_rejection=True)
        await agent.propose_and_wait("r1", "start", raise_on_rejection=True)
        await agent.propose_and_wait("r1", "pause_for_approval", raise_on_rejection=True)
        await env.advance(minutes=14)
        assert env.alerts == []
        await env.advance(minutes=2)  # 15 minutes before the timeout: the reminder
        assert [a.rule for a in env.alerts] == ["approval_reminder"]
        snapshot = await agent.snapshot("r1")
        assert snapshot is not None and snapshot.state == "paused"
        await env.advance(hours=2)
        snapshot = await agent.snapshot("r1")
        assert snapshot is not None and snapshot.state == "failed"
        last = (await agent.history("r1"))[-1]
        assert (last.event, last.reason, last.principal.authority) == (
            "timeout",
            "approval_timeout",
            "runtime",
        )
        assert last.at_ms == snapshot.updated_at_ms  # at its due time, not the end of the move

    began = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - began < 2  # two hours and a quarter, in well under a second


def test_the_workers_rules_hold() -> None:
    """Authority, the approval's rules, dedupe and steps are the engine's own."""

    async def main() -> None:
        env = RunstateEnvironment()
        agent, approver = env.client(), env.client("approver")
        await agent.create_and_wait("r2", M, raise_on_rejection=True)
        with pytest.raises(Rejected) as refused:  # only an approver decides an approval
            await approver.propose_and_wait("r2", "start", raise_on_rejection=True)
        assert refused.value.code is RejectionCode.UNAUTHORIZED
        start = await agent.propose_and_wait("r2", "start", proposal_id="p-start")
        again = await agent.propose_and_wait("r2", "start", proposal_id="p-start")
        assert isinstance(start, Transition) and again == start  # a retry, the original
        await agent.propose_and_wait("r2", "pause_for_approval", raise_on_rejection=True)
        with pytest.raises(Rejected) as refused:  # the runtime that paused may not decide
            await agent.decide("r2", raise_on_rejection=True)
        assert refused.value.code is RejectionCode.UNAUTHORIZED
        granted = await approver.decide("r2", raise_on_rejection=True)
        assert isinstance(granted, Transition) and granted.to_state == "running"
        calls: list[int] = []

        async def charge() -> dict[str, bool]:
            calls.append(1)
            return {"charged": True}

        assert await agent.run_step("r2", "charge", charge, key="c-1") == {"charged": True}
        assert await agent.run_step("r2", "charge", charge, key="c-1") == {"charged": True}
        assert calls == [1]
        done = await agent.propose_and_wait("r2", "complete", raise_on_rejection=True)
        assert isinstance(done, Transition) and done.to_state == "done"
        view = await agent.resume("r2")
        assert view is not None and view.state == "done"

    asyncio.run(main())


def test_retries_back_off_on_the_moved_clock_and_the_blocking_client() -> None:
    env = RunstateEnvironment(start_ms=1_700_000_000_000)
    client = env.blocking_client()
    client.create_and_wait("r3", M, max_retries=1, raise_on_rejection=True)
    client.propose_and_wait("r3", "start", raise_on_rejection=True)
    client.propose_and_wait("r3", "transient_error", raise_on_rejection=True)
    env.advance_blocking(seconds=3)  # the backoff (1 s, jittered) passes: retry proposed
    snapshot = client.snapshot("r3")
    assert snapshot is not None and (snapshot.state, snapshot.retry_count) == ("running", 1)
    client.propose_and_wait("r3", "transient_error", raise_on_rejection=True)
    env.advance_blocking(minutes=10)  # the budget spent: max_retries_exceeded
    snapshot = client.snapshot("r3")
    assert snapshot is not None and snapshot.state == "failed"
    assert [t.event for t in client.history("r3")][-1] == "max_retries_exceeded"
    assert env.now_ms == 1_700_000_000_000 + 3_000 + 600_000


def test_a_record_that_is_no_proposal_says_why() -> None:
    env = RunstateEnvironment()
    client = env.blocking_client()
    client.send_raw(b"r4", b"not json")
    assert len(env.dead_letters) == 1
    with pytest.raises(ValueError, match="the clock only moves on"):
        env.advance_blocking(seconds=-1)
    with pytest.raises(ValueError, match="no key 'nobody' here"):
        env.client("nobody")


def test_watches_see_commits_in_order_and_resume() -> None:
    async def main() -> None:
        env = RunstateEnvironment()
        agent = env.client()
        paused = agent.watch_state("paused")

        async def first(watch: AsyncWatch, count: int) -> list[Transition]:
            seen: list[Transition] = []
            async for transition in watch:
                seen.append(transition)
                if len(seen) == count:
                    return seen
            return seen

        entering = asyncio.create_task(first(paused, 1))
        run = agent.watch("w1")
        following = asyncio.create_task(first(run, 3))
        await asyncio.sleep(0)  # both watchers wait for commits
        await agent.create_and_wait("w1", M, raise_on_rejection=True)
        await agent.propose_and_wait("w1", "start", raise_on_rejection=True)
        await agent.propose_and_wait("w1", "pause_for_approval", raise_on_rejection=True)
        seen = await asyncio.wait_for(following, 5)
        assert [t.to_state for t in seen] == ["planned", "running", "paused"]
        assert [t.run_id for t in await asyncio.wait_for(entering, 5)] == ["w1"]
        await env.advance(hours=1)  # the approval times out
        later = await asyncio.wait_for(first(agent.watch("w1", resume_from=run.position), 1), 5)
        assert [t.to_state for t in later] == ["failed"]

    asyncio.run(main())
    env = RunstateEnvironment()
    client = env.blocking_client()
    client.create_and_wait("w2", M, raise_on_rejection=True)
    client.propose_and_wait("w2", "start", raise_on_rejection=True)
    assert [t.to_state for t in client.watch("w2")] == ["planned", "running"]


def test_a_stored_result_the_refusal_left_out_is_read_from_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refusal too large for its topic leaves the step's stored result out: the step
    reads it from the run, and never takes the missing result for None."""
    env = RunstateEnvironment()
    client = env.blocking_client()
    client.create_and_wait("s1", M, raise_on_rejection=True)
    client.propose_and_wait("s1", "start", raise_on_rejection=True)
    assert client.run_step("s1", "charge", lambda: {"n": 1}, key="k") == {"n": 1}
    answered = client.propose_and_wait

    def cut(*args: Any, **kwargs: Any) -> Any:
        outcome = answered(*args, **kwargs)
        return outcome.evolved(step_result=None) if isinstance(outcome, Rejection) else outcome

    monkeypatch.setattr(client, "propose_and_wait", cut)
    never: list[int] = []
    assert client.run_step("s1", "charge", lambda: never.append(1), key="k") == {"n": 1}

    def unreadable(run_id: str) -> None:
        raise ValueError("no worker URL given")

    monkeypatch.setattr(client, "snapshot", unreadable)
    with pytest.raises(NotServed, match="stored result of step 'charge'"):
        client.run_step("s1", "charge", lambda: never.append(1), key="k")
    assert never == []
