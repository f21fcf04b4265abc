"""The SDK on a real broker: the asyncio client under 100 concurrent agents, an answer
faster than `wait()`, a dead broker, the resend of a committed proposal, and what the
waiter keeps. One worker serves the module (3 partitions)."""

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from processor.client import (
    AsyncRunstateClient,
    AsyncWatch,
    KafkaSettings,
    NotAwaited,
    OutcomeWaiter,
    Rejected,
    Rejection,
    RejectionCode,
    RunstateClient,
    Transition,
    Unavailable,
)
from processor.kafka.partitioning import partition_for
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames
from tests.integration.harness import Env, WorkerProcess, eventually, make_env

M = "task_lifecycle"
DEAD = "127.0.0.1:1"  # nobody listens there


#: One process starts the module's worker once for every test here.
pytestmark = pytest.mark.xdist_group("sdk")


@pytest.fixture(scope="module")
def served(
    kafka_bootstrap: str, admin: AdminClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Env, WorkerProcess]]:
    topics = TopicNames.with_prefix(f"t-{uuid.uuid4().hex[:10]}.")
    create_topics(admin, plan_topics(topics, partitions=3, replication=1))
    env = make_env(kafka_bootstrap, topics, tmp_path_factory.mktemp("sdk"))
    worker = WorkerProcess(env, env.tmp / "w1")
    try:
        worker.wait_ready(partitions=3)
        yield env, worker
    finally:
        worker.terminate()


def _async_client(env: Env, worker_urls: tuple[str, ...] = ()) -> AsyncRunstateClient:
    return AsyncRunstateClient(
        KafkaSettings(env.bootstrap),
        env.topics,
        signing_key=env.signing_key("runtime"),
        worker_urls=worker_urls,
    )


def _run(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_a_hundred_asyncio_agents_share_one_client(served: tuple[Env, WorkerProcess]) -> None:
    """One AsyncRunstateClient shared by 100 agent tasks: each creates its run, starts
    it, and sends an event its machine does not have; every outcome is its own."""
    env, _ = served

    async def agent(client: AsyncRunstateClient, n: int) -> None:
        run_id = f"agent-{n}-{uuid.uuid4().hex[:6]}"
        created = await client.create_and_wait(run_id, M, timeout=30)
        assert isinstance(created, Transition) and created.run_id == run_id, created
        assert created.to_state == "planned"
        started = await client.propose_and_wait(run_id, "start", timeout=30)
        assert isinstance(started, Transition), started
        assert (started.run_id, started.revision, started.to_state) == (run_id, 1, "running")
        with pytest.raises(Rejected) as refused:
            await client.propose_and_wait(run_id, "no_such_event", raise_on_rejection=True)
        assert refused.value.code is RejectionCode.UNKNOWN_EVENT
        assert refused.value.rejection.run_id == run_id

    async def main() -> float:
        began = time.monotonic()
        async with _async_client(env) as client:
            await asyncio.gather(*(agent(client, n) for n in range(100)))
            assert client.outcomes.kept() == 0  # every outcome handed over and forgotten
        return time.monotonic() - began

    took = asyncio.run(main())
    assert took < 60, took


def test_an_answer_faster_than_wait_is_not_missed(served: tuple[Env, WorkerProcess]) -> None:
    env, worker = served
    run_id = _run("fast")
    with env.client() as client:
        pid = client.create(run_id, M)
        client.flush()
        deadline = time.monotonic() + 30
        while worker.snapshot(run_id) is None:  # the worker has answered
            assert time.monotonic() < deadline, "the worker did not create the run"
            time.sleep(0.05)
        # Served from the store, written only after the commit: the answer is in the topic.
        outcome = client.wait(pid, timeout=10)
        assert isinstance(outcome, Transition) and outcome.proposal_id == pid

    async def main() -> None:
        async with _async_client(env) as client:
            pid = await client.propose(run_id, "start")
            await client.flush()
            deadline = time.monotonic() + 30
            while (snap := worker.snapshot(run_id)) is None or snap.revision < 1:
                assert time.monotonic() < deadline, "the worker did not start the run"
                await asyncio.sleep(0.05)
            started = await client.wait(pid, timeout=10)
            assert isinstance(started, Transition) and started.to_state == "running"

    asyncio.run(main())


def test_a_dead_broker_is_unavailable_within_the_timeout(tmp_path: Path) -> None:
    """Nobody listens at the bootstrap address: `Unavailable` within the call's timeout
    (never librdkafka's own exception, never its 30 s and more)."""
    topics = TopicNames.with_prefix("dead.")
    key = make_env(DEAD, topics, tmp_path).signing_key("runtime")
    began = time.monotonic()
    with pytest.raises(Unavailable, match=re.escape(DEAD)):
        client = RunstateClient(KafkaSettings(DEAD), topics, signing_key=key, timeout=3)
        try:
            client.propose_and_wait("r1", "start", timeout=3)
        finally:
            client.close(timeout=0.5)
    assert time.monotonic() - began < 4.5  # the 3 s asked for, and no more than slack

    async def main() -> None:
        client = AsyncRunstateClient(KafkaSettings(DEAD), topics, signing_key=key, timeout=3)
        try:
            await client.create_and_wait("r1", M, timeout=3)
        finally:
            await client.close(timeout=0.5)

    began = time.monotonic()
    with pytest.raises(Unavailable, match=re.escape(DEAD)):
        asyncio.run(main())
    assert time.monotonic() - began < 4.5  # the 3 s asked for, and no more than slack


def test_a_resent_committed_proposal_returns_the_original_transition(
    served: tuple[Env, WorkerProcess],
) -> None:
    env, worker = served
    run_id, pid = _run("resend"), f"create-{uuid.uuid4().hex}"
    with env.client() as client:
        first = client.create_and_wait(run_id, M, proposal_id=pid, timeout=30)
        assert isinstance(first, Transition), first
        again = client.create_and_wait(run_id, M, proposal_id=pid, timeout=30)
        assert again == first  # not the `duplicate` rejection: the original transition

    async def main() -> None:
        # through a worker URL this time (the sync client above read the partition)
        async with _async_client(env, worker_urls=(worker.url,)) as client:
            again = await client.create_and_wait(run_id, M, proposal_id=pid, timeout=30)
            assert again == first
            plain = await client.create_and_wait(run_id, M, timeout=30)  # a new id
            assert isinstance(plain, Rejection) and plain.code is RejectionCode.RUN_EXISTS

    asyncio.run(main())


def test_the_waiter_keeps_only_what_its_client_waits_for(
    served: tuple[Env, WorkerProcess],
) -> None:
    """Another client's 300 runs pass through every partition; this client's waiter
    follows only its run's partitions and keeps none of their outcomes."""
    env, _ = served
    mine = _run("mine")
    with env.client() as client, env.client() as others:
        created = client.create_and_wait(mine, M, timeout=30)
        assert isinstance(created, Transition)
        waiter = client.outcomes
        assert len(waiter.followed()) == 3  # one partition of each output topic
        assert {p for _, p in waiter.followed()} == {created_partition(client, mine)}

        pids = [others.create(_run("other"), M) for _ in range(300)]
        others.flush()
        for pid in pids[-20:]:
            others.wait(pid, timeout=30)
        unclaimed = client.propose(mine, "start")  # registered, never waited for here
        # Its outcome follows the others' in the partition: once it is read, so are they.
        read, dropped = eventually("its start's outcome read", lambda: _counts(waiter, 2))
        assert waiter.kept() == 1  # only the unclaimed outcome of its own proposal
        assert dropped > 0  # the others' outcomes of the same partition
        assert read - dropped == 2  # its create, and the unclaimed start
        assert waiter.read < 300  # the other partitions were never read
        assert isinstance(client.wait(unclaimed, timeout=5), Transition)
        assert waiter.kept() == 0


def test_unclaimed_outcomes_are_bounded(served: tuple[Env, WorkerProcess]) -> None:
    env, _ = served
    client = RunstateClient(
        KafkaSettings(env.bootstrap),
        env.topics,
        signing_key=env.signing_key("runtime"),
        max_unclaimed=5,
    )
    with client:
        pids = [client.create(_run("lru"), M) for _ in range(20)]
        client.flush()
        assert client.outcomes.kept() == 5
        assert isinstance(client.wait(pids[-1], timeout=30), Transition)
        with pytest.raises(NotAwaited, match="max_unclaimed"):
            client.wait(pids[0], timeout=1)


def _counts(waiter: OutcomeWaiter, kept: int) -> tuple[int, int] | None:
    """(read, dropped) as of one moment (the loop moves both under one lock), once at
    least `kept` outcomes were read and not dropped; None until then."""
    read = waiter.read
    dropped = waiter.dropped()
    return (read, dropped) if waiter.read == read and read - dropped >= kept else None


def created_partition(client: RunstateClient, run_id: str) -> int:
    return partition_for(run_id, client.outcomes.partitions())


def test_a_client_reads_what_it_was_just_answered(served: tuple[Env, WorkerProcess]) -> None:
    """The worker moves its state just after the transaction that carried the answer:
    a read right after `*_and_wait` still sees that transition or a later one (the
    client asks for it and the worker waits for it), never the state before."""
    env, worker = served
    runs = [_run("ryw") for _ in range(4)]

    async def agent(client: AsyncRunstateClient, run_id: str) -> None:
        await client.create_and_wait(run_id, M, raise_on_rejection=True)
        await client.propose_and_wait(run_id, "start", raise_on_rejection=True)
        for n in range(25):
            done = await client.propose_and_wait(
                run_id, "checkpoint", payload={"data": {"n": n}}, raise_on_rejection=True
            )
            assert isinstance(done, Transition)
            snapshot = await client.snapshot(run_id)
            assert snapshot is not None and snapshot.revision >= done.revision, (n, snapshot)
            assert snapshot.checkpoint == {"n": n}
            view = await client.resume(run_id)
            assert view is not None and view.checkpoint == {"n": n}

    async def main() -> None:
        async with _async_client(env, (worker.url,)) as client:
            await asyncio.gather(*(agent(client, r) for r in runs))

    asyncio.run(main())
    key = env.signing_key("runtime")
    urls = [worker.url]
    with RunstateClient(
        KafkaSettings(env.bootstrap), env.topics, signing_key=key, worker_urls=urls
    ) as client:
        for n in range(25):
            done = client.propose_and_wait(runs[0], "checkpoint", payload={"data": {"s": n}})
            assert isinstance(done, Transition)
            snapshot = client.snapshot(runs[0])
            assert snapshot is not None and snapshot.checkpoint == {"s": n}
            assert client.history(runs[0])[-1].revision >= done.revision


def test_a_step_runs_its_side_effect_once(served: tuple[Env, WorkerProcess]) -> None:
    """Through the asyncio SDK as an agent writes it: a step's body runs once; run
    again (a retried agent), the step hands back the stored result without running it;
    a body that raises records step_failed and the step runs again; a step left
    executing (a crashed attempt) is refused step_in_progress, its body not run."""
    env, worker = served
    done: list[str] = []

    async def refund() -> dict[str, object]:
        done.append("refund")
        return {"receipt": "r-1", "amount": 42}

    async def flaky() -> str:
        done.append("flaky")
        if done.count("flaky") == 1:
            raise RuntimeError("gateway timeout")
        return "ok"

    async def main() -> None:
        async with _async_client(env, (worker.url,)) as client:
            run_id = _run("steps")
            await client.create_and_wait(run_id, M, raise_on_rejection=True)
            await client.propose_and_wait(run_id, "start", raise_on_rejection=True)
            first = await client.run_step(run_id, "refund", refund, key="refund-7", call_id="c1")
            again = await client.run_step(run_id, "refund", refund, key="refund-7")
            assert first == again == {"receipt": "r-1", "amount": 42}
            async with client.step(run_id, "refund", key="refund-7") as step:
                assert step.done and step.result == first
            assert done == ["refund"]
            with pytest.raises(RuntimeError, match="gateway timeout"):
                await client.run_step(run_id, "notify", flaky, key="n-1")
            assert await client.run_step(run_id, "notify", flaky, key="n-1") == "ok"
            assert done == ["refund", "flaky", "flaky"]
            await client.propose_and_wait(
                run_id,
                "step_started",
                payload={"step": "ship", "idempotency_key": "s-1"},
                raise_on_rejection=True,
            )
            with pytest.raises(Rejected) as refused:
                await client.run_step(run_id, "ship", refund, key="s-1")
            assert refused.value.code is RejectionCode.STEP_IN_PROGRESS
            assert done == ["refund", "flaky", "flaky"]
            snapshot = await client.snapshot(run_id)
            assert snapshot is not None
            steps = {name: (s.status.value, s.result) for name, s in snapshot.steps.items()}
            assert steps == {
                "refund": ("succeeded", first),
                "notify": ("succeeded", "ok"),
                "ship": ("executing", None),
            }
            assert snapshot.steps["refund"].call_id == "c1"

    asyncio.run(main())


def test_a_step_in_the_blocking_client(served: tuple[Env, WorkerProcess]) -> None:
    env, _ = served
    client = env.client()
    calls: list[int] = []
    try:
        run_id = _run("sync-steps")
        client.create_and_wait(run_id, M, raise_on_rejection=True)
        client.propose_and_wait(run_id, "start", raise_on_rejection=True)
        with client.step(run_id, "charge", key="ch-1") as step:
            assert not step.done
            calls.append(1)
            step.result = {"charged": True}
        assert client.run_step(run_id, "charge", lambda: calls.append(2), key="ch-1") == {
            "charged": True
        }
        assert calls == [1]
        done = client.propose_and_wait(run_id, "complete", raise_on_rejection=True)
        assert isinstance(done, Transition) and done.to_state == "done"
    finally:
        client.close()


def test_watching_a_run_and_a_state_resumes_where_it_left_off(
    served: tuple[Env, WorkerProcess],
) -> None:
    """A run's watch sees its transitions in order, from its first; stopped and resumed
    from its position, it sees the later ones only, none twice. A state's watch sees
    the runs entering that state from when it starts."""
    env, _ = served

    async def take(watch: AsyncWatch, count: int) -> list[Transition]:
        seen: list[Transition] = []
        async for transition in watch:
            seen.append(transition)
            if len(seen) == count:
                break
        return seen

    async def main() -> None:
        async with _async_client(env) as client:
            run_id, other = _run("watched"), _run("other")
            paused = client.watch_state("paused", machine=M)
            entering = asyncio.create_task(take(paused, 2))

            async def positioned() -> None:  # the state's watch starts before runs change
                while not paused.position:
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(positioned(), 30)
            for run in (run_id, other):
                await client.create_and_wait(run, M, raise_on_rejection=True)
                await client.propose_and_wait(run, "start", raise_on_rejection=True)
            watch = client.watch(run_id)
            first = await take(watch, 2)
            assert [(t.revision, t.to_state) for t in first] == [(0, "planned"), (1, "running")]
            position = dict(watch.position)
            await watch.close()
            for run in (run_id, other):
                await client.propose_and_wait(run, "pause_for_approval", raise_on_rejection=True)
            resumed = client.watch(run_id, resume_from=position)
            later = await asyncio.wait_for(take(resumed, 1), 30)
            assert [(t.revision, t.to_state) for t in later] == [(2, "paused")]
            await resumed.close()
            into = await asyncio.wait_for(entering, 30)
            assert sorted(t.run_id for t in into) == sorted([run_id, other])
            assert all(t.to_state == "paused" for t in into)
            await paused.close()

    asyncio.run(main())


def test_watching_in_the_blocking_client(served: tuple[Env, WorkerProcess]) -> None:
    env, _ = served
    client = env.client()
    run_id = _run("watched-sync")
    try:
        client.create_and_wait(run_id, M, raise_on_rejection=True)
        client.propose_and_wait(run_id, "start", raise_on_rejection=True)
        seen: list[str] = []
        deadline = time.monotonic() + 30
        with client.watch(run_id) as watch:
            while len(seen) < 2 and time.monotonic() < deadline:
                found = watch.poll()
                if found is not None:
                    seen.append(found.to_state)
        assert seen == ["planned", "running"]
    finally:
        client.close()
