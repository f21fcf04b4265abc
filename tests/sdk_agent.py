"""A small agent written against the SDK alone, kept here for `mypy --strict`
(tests/unit/test_sdk_core.py runs it): the SDK's types must be enough for a strictly
typed agent, importing one module."""

import asyncio
from pathlib import Path

from processor.client import (
    AsyncRunstateClient,
    Heartbeat,
    InvalidArgument,
    KafkaSettings,
    NotFound,
    NotServed,
    Rejected,
    Rejection,
    RejectionCode,
    RunSnapshot,
    RunstateClient,
    Timeout,
    TopicNames,
    Transition,
    Unavailable,
    load_signing_key,
)
from processor.testing import RunstateEnvironment


def refund(key_file: Path, run_id: str) -> RunSnapshot | None:
    key = load_signing_key(key_file)
    with RunstateClient(
        KafkaSettings("127.0.0.1:9092"),
        TopicNames.with_prefix(),
        signing_key=key,
        worker_urls=["http://127.0.0.1:8080"],
        timeout=10,
    ) as client:
        created = client.create_and_wait(run_id, "task_lifecycle", max_retries=3)
        if isinstance(created, Rejection) and created.code is not RejectionCode.RUN_EXISTS:
            raise SystemExit(f"{created.code.value}: {created.detail}")
        try:
            started = client.propose_and_wait(run_id, "start", raise_on_rejection=True)
        except Rejected as exc:
            print(exc.code, exc.detail, exc.rejection.proposal_id)
            return None
        except (Timeout, Unavailable) as exc:
            print(f"try again later: {exc}")
            return None
        if isinstance(started, Transition):
            print(started.to_state, started.revision)
        beat = client.propose_and_wait(run_id, "heartbeat")
        if isinstance(beat, Heartbeat):
            print(beat.deadline_ms)
        return client.snapshot(run_id)


async def many(key_file: Path, run_ids: list[str]) -> list[str]:
    key = load_signing_key(key_file)
    async with AsyncRunstateClient(
        KafkaSettings("127.0.0.1:9092"), TopicNames.with_prefix(), signing_key=key
    ) as client:

        async def one(run_id: str) -> str:
            await client.create_and_wait(run_id, "task_lifecycle")
            outcome = await client.propose_and_wait(run_id, "start", timeout=5)
            return Rejected.raise_for(outcome).run_id

        return list(await asyncio.gather(*(one(r) for r in run_ids)))


async def pay_back(order: str) -> dict[str, str | int]:
    return {"refund_id": f"rf-{order}", "amount_cents": 1250}


async def with_steps(client: AsyncRunstateClient, run_id: str) -> str:
    created = await client.create_and_wait(run_id, "task_lifecycle", max_retries=2)
    if isinstance(created, Rejection):
        return created.code.value
    await client.propose_and_wait(run_id, "start", reason="go", raise_on_rejection=True)
    async with client.step(run_id, "refund", key=f"{run_id}:refund", call_id="c1") as step:
        if not step.done:
            step.result = await pay_back(run_id)
    receipt = step.result
    again = await client.run_step(
        run_id, "refund", lambda: pay_back(run_id), key=f"{run_id}:refund"
    )
    assert again == receipt
    try:
        done = await client.propose_and_wait(run_id, "complete", raise_on_rejection=True)
    except Rejected as refused:
        code: RejectionCode = refused.code
        return code.value
    except (Timeout, Unavailable, InvalidArgument, NotFound, NotServed) as exc:
        return str(exc)
    assert isinstance(done, Transition)
    snapshot: RunSnapshot | None = await client.snapshot(run_id)
    revision: int = done.revision
    return f"{snapshot.state if snapshot else 'gone'}@{revision}"


def in_the_test_environment() -> str:
    """`with_steps` run where it needs no broker (tests/unit/test_sdk_core.py runs it)."""
    env = RunstateEnvironment()
    return asyncio.run(with_steps(env.client(), "order-9"))
