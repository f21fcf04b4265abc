"""A small agent written against the SDK alone, kept here for `mypy --strict`
(tests/unit/test_sdk_core.py runs it): the SDK's types must be enough for a strictly
typed agent, importing one module."""

import asyncio
from pathlib import Path

from processor.client import (
    AsyncRunstateClient,
    Heartbeat,
    KafkaSettings,
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
