"""`AsyncRunstateClient`: the asyncio face of the SDK, on the same core as the blocking
client.

Outcomes come through an `AsyncOutcomeWaiter` (`waiter`). Proposals go through a
plain `confluent_kafka.Producer` whose delivery reports resolve asyncio futures
(`aio_deliveries`): the installed `AIOProducer` refuses headers in its batch mode
(NotImplementedError), and a proposal's signature is in its headers. Reads from the
workers' HTTP API and the lookup of an original transition are blocking and run in a
thread.
"""

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaException, Producer

from processor.engine.machine import Machine
from processor.history.resume import ResumeView, resume_view
from schemas.messages import RunSnapshot, Transition

from .aio_deliveries import Deliveries
from .base import ClientBase
from .core import (
    DECISION_TTL_MS,
    Deadline,
    Outcome,
    ProposalRecord,
    approval_payload,
    catalog,
    continuation,
    decision_event,
    duplicate_of,
    pending_decision,
    producer_config,
    unavailable,
)
from .errors import Rejected
from .lookup import committed_transition
from .steps import AsyncStep, T, run_async_step
from .waiter import AsyncOutcomeWaiter
from .watch import AsyncWatch, Position, run_watch, state_watch


class AsyncRunstateClient(ClientBase):
    """The asyncio twin of `RunstateClient`: the same methods, awaited.

        async with AsyncRunstateClient(settings, topics, signing_key=key) as client:
            outcome = await client.propose_and_wait("run-7", "start", timeout=10)

    One client serves many concurrent tasks of one event loop (it is built in, and
    bound to, the loop that first uses it)."""

    def _open(self) -> None:
        self._producer: Producer | None = None
        self._deliveries: Deliveries | None = None
        self._waiter: AsyncOutcomeWaiter | None = None
        self._pending: set[asyncio.Future[None]] = set()
        self._delivery_error: BaseException | None = None

    async def __aenter__(self) -> "AsyncRunstateClient":
        self._started()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _started(self) -> tuple[Producer, Deliveries, AsyncOutcomeWaiter]:
        if self._producer is None or self._deliveries is None or self._waiter is None:
            self._producer = Producer(producer_config(self.settings, self.timeout))
            self._deliveries = Deliveries(self._producer, asyncio.get_running_loop())
            self._waiter = AsyncOutcomeWaiter(
                self.settings, self.topics, max_unclaimed=self.max_unclaimed
            )
        return self._producer, self._deliveries, self._waiter

    @property
    def outcomes(self) -> AsyncOutcomeWaiter:
        """The client's waiter (what it follows and keeps)."""
        return self._started()[2]

    # -- proposing -------------------------------------------------------------
    async def propose(
        self,
        run_id: str,
        event: str,
        *,
        payload: dict[str, Any] | None = None,
        reason: str | None = None,
        expected_revision: int | None = None,
        metadata: dict[str, Any] | None = None,
        proposal_id: str | None = None,
        timeout: float | None = None,
    ) -> str:
        """Send a signed proposal; returns its proposal id once it is handed to the
        producer (`flush()` or `*_and_wait` wait for its delivery)."""
        record = self._record(
            run_id, event, payload, reason, expected_revision, metadata, proposal_id
        )
        await self._send(record, Deadline(self.timeout if timeout is None else timeout))
        return record.proposal_id

    async def _send(self, record: ProposalRecord, deadline: Deadline) -> "asyncio.Future[None]":
        producer, deliveries, waiter = self._started()
        await waiter.expect(record.run_id, record.proposal_id, max(0.1, deadline.left()))
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        while True:
            try:
                producer.produce(
                    self.topics.proposals,
                    key=record.key,
                    value=record.value,
                    headers=record.headers,
                    on_delivery=deliveries.reporter(delivered),
                )
                break
            except BufferError:
                await asyncio.sleep(0.05)  # the delivery thread drains the queue
        self._pending.add(delivered)
        delivered.add_done_callback(self._delivered)
        return delivered

    def _delivered(self, future: "asyncio.Future[None]") -> None:
        self._pending.discard(future)
        if not future.cancelled() and future.exception() is not None:
            self._delivery_error = future.exception()

    async def create(
        self,
        run_id: str,
        machine: str,
        *,
        max_retries: int | None = None,
        success_criteria: list[str] | None = None,
        deadlines: dict[str, int] | None = None,
        proposal_id: str | None = None,
        timeout: float | None = None,
    ) -> str:
        record = self._create_record(
            run_id, machine, max_retries, success_criteria, deadlines, proposal_id
        )
        await self._send(record, Deadline(self.timeout if timeout is None else timeout))
        return record.proposal_id

    async def heartbeat(self, run_id: str, *, timeout: float | None = None) -> str:
        """A sign of life for a running run; its answer is a `Heartbeat`."""
        return await self.propose(run_id, "heartbeat", timeout=timeout)

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every proposal sent is delivered; `Unavailable` when one could not
        be, or not within `timeout`."""
        timeout = self.timeout if timeout is None else timeout
        pending = list(self._pending)
        if pending:
            _, left = await asyncio.wait(pending, timeout=timeout)
            if left:
                raise unavailable(
                    self.settings,
                    f"delivering proposals ({len(left)} not delivered)",
                    timeout,
                    "timed out",
                )
        if self._delivery_error is not None:
            error, self._delivery_error = self._delivery_error, None
            raise unavailable(self.settings, "delivering a proposal", timeout, error)

    # -- outcomes --------------------------------------------------------------
    async def wait(self, proposal_id: str, timeout: float | None = None) -> Outcome:
        """The proposal's outcome, once; for a retry of a committed proposal, the
        transition it committed then. `Timeout` when none came in time."""
        deadline = Deadline(self.timeout if timeout is None else timeout)
        with self._awaiting(proposal_id) as note:
            outcome = await self.outcomes.wait(proposal_id, deadline.left())
            original = duplicate_of(outcome)
            if original is not None:
                found = await self.transition(*original, timeout=max(1.0, deadline.left()))
                outcome = outcome if found is None else found
            self.reader.saw(outcome)
            note(outcome)
            return outcome

    async def propose_and_wait(
        self,
        run_id: str,
        event: str,
        *,
        payload: dict[str, Any] | None = None,
        reason: str | None = None,
        expected_revision: int | None = None,
        metadata: dict[str, Any] | None = None,
        proposal_id: str | None = None,
        timeout: float | None = None,
        raise_on_rejection: bool = False,
    ) -> Outcome:
        """Propose (as `propose`) and wait for the outcome, all within `timeout`. With
        `raise_on_rejection`, a `Rejection` is raised as `Rejected`."""
        deadline = Deadline(self.timeout if timeout is None else timeout)
        record = self._record(
            run_id, event, payload, reason, expected_revision, metadata, proposal_id
        )
        return await self._deliver_and_wait(record, deadline, raise_on_rejection)

    async def decide(
        self,
        run_id: str,
        *,
        grant: bool = True,
        pause: int | None = None,
        expires_in_ms: int = DECISION_TTL_MS,
        event: str | None = None,
        machines: Mapping[str, Machine] | None = None,
        reason: str | None = None,
        metadata: dict[str, Any] | None = None,
        proposal_id: str | None = None,
        timeout: float | None = None,
        raise_on_rejection: bool = False,
    ) -> Outcome:
        """An approver's decision on the run's approval wait, as `RunstateClient.decide`:
        the pause read from the run's snapshot unless given."""
        deadline = Deadline(self.timeout if timeout is None else timeout)
        if pause is None:
            snapshot = await self.snapshot(run_id)
            pause, event = pending_decision(run_id, snapshot, grant, event, machines)
        return await self.propose_and_wait(
            run_id,
            event or decision_event(None, grant),
            payload=approval_payload(pause, expires_in_ms, self._now_ms()),
            reason=reason,
            metadata=metadata,
            proposal_id=proposal_id,
            timeout=deadline.left(),
            raise_on_rejection=raise_on_rejection,
        )

    async def create_and_wait(
        self,
        run_id: str,
        machine: str,
        *,
        max_retries: int | None = None,
        success_criteria: list[str] | None = None,
        deadlines: dict[str, int] | None = None,
        proposal_id: str | None = None,
        timeout: float | None = None,
        raise_on_rejection: bool = False,
    ) -> Outcome:
        """Create the run (as `create`) and wait for the outcome, all within `timeout`."""
        deadline = Deadline(self.timeout if timeout is None else timeout)
        record = self._create_record(
            run_id, machine, max_retries, success_criteria, deadlines, proposal_id
        )
        return await self._deliver_and_wait(record, deadline, raise_on_rejection)

    async def _deliver_and_wait(
        self, record: ProposalRecord, deadline: Deadline, raise_on_rejection: bool
    ) -> Outcome:
        delivered = await self._send(record, deadline)
        try:
            await asyncio.wait_for(asyncio.shield(delivered), deadline.left())
        except TimeoutError:
            raise unavailable(
                self.settings, "delivering the proposal", deadline.timeout, "timed out"
            ) from None
        except KafkaException as exc:
            raise unavailable(
                self.settings, "delivering the proposal", deadline.timeout, exc
            ) from exc
        outcome = await self.wait(record.proposal_id, deadline.left())
        return Rejected.raise_for(outcome) if raise_on_rejection else outcome

    async def transition(
        self, run_id: str, transition_id: str, timeout: float = 30.0
    ) -> Transition | None:
        """A committed transition of the run, by id (see `RunstateClient.transition`)."""
        partitions = await self.outcomes.partitions(timeout)
        return await asyncio.to_thread(
            committed_transition,
            self.reader,
            self.settings,
            self.topics,
            partitions,
            run_id,
            transition_id,
            timeout,
        )

    # -- reads -----------------------------------------------------------------
    async def snapshot(self, run_id: str) -> RunSnapshot | None:
        """The run's committed snapshot, from the owning worker (None: no such run)."""
        return await asyncio.to_thread(self.reader.snapshot, run_id)

    get = snapshot

    async def resume(
        self, run_id: str, machines: Mapping[str, Machine] | None = None
    ) -> ResumeView | None:
        """What a restarted agent rebuilds its context from (None: no such run): the
        run's state, completed steps with results, steps left `executing` (outcome
        unknown: check before redoing), failed steps, checkpoint data, pending deadlines
        and the events it may send next. `machines`: the workers' catalog (default: the
        built-in machines)."""
        snapshot = await self.snapshot(run_id)
        if snapshot is None:
            return None
        return resume_view(snapshot, await self.history(run_id), catalog(machines))

    async def continue_run(
        self,
        run_id: str,
        predecessor: str,
        *,
        machines: Mapping[str, Machine] | None = None,
        timeout: float | None = None,
        raise_on_rejection: bool = False,
    ) -> Outcome:
        """Create run `run_id` continuing the finished run `predecessor`: a new run at
        its machine's initial state carrying the predecessor's succeeded steps, the steps
        it left executing (still executing) and its checkpoint, linked to its last
        transition. Waits for the outcome."""
        payload = continuation(predecessor, await self.snapshot(predecessor), machines)
        return await self.propose_and_wait(
            run_id,
            "create",
            payload=payload,
            timeout=timeout,
            raise_on_rejection=raise_on_rejection,
        )

    async def history(self, run_id: str) -> list[Transition]:
        return await asyncio.to_thread(self.reader.history, run_id)

    # -- steps -----------------------------------------------------------------
    def step(
        self,
        run_id: str,
        name: str,
        *,
        key: str,
        call_id: str | None = None,
        timeout: float | None = None,
    ) -> AsyncStep:
        """A side effect done at most once: `async with client.step(...) as step`,
        the body doing it unless `step.done` (processor/client/steps.py). `key`: the
        side effect's idempotency key, as its tool knows it; `call_id`: the tool call."""
        return AsyncStep(self, run_id, name, key, call_id, timeout)

    async def run_step(
        self,
        run_id: str,
        name: str,
        action: Callable[[], Awaitable[T]],
        *,
        key: str,
        call_id: str | None = None,
        timeout: float | None = None,
    ) -> T:
        """`await action()` as step `name` of the run, unless the step succeeded before:
        then its stored result, without calling `action`."""
        return await run_async_step(
            self.step(run_id, name, key=key, call_id=call_id, timeout=timeout), action
        )

    def watch(
        self, run_id: str, *, resume_from: Position | None = None, since_ms: int | None = None
    ) -> AsyncWatch:
        """The run's transitions as they commit: `async for t in client.watch(run_id)`;
        resume a watch from its `position` (processor/client/watch.py)."""
        settings, topics, timeout = self.settings, self.topics, self.timeout
        return AsyncWatch(
            lambda: run_watch(settings, topics, run_id, resume_from, since_ms, timeout)
        )

    def watch_state(
        self, state: str, *, machine: str | None = None, resume_from: Position | None = None
    ) -> AsyncWatch:
        """The transitions into `state` as they commit, from now or from `resume_from`."""
        settings, topics, timeout = self.settings, self.topics, self.timeout
        return AsyncWatch(
            lambda: state_watch(settings, topics, state, machine, resume_from, timeout)
        )

    async def close(self, timeout: float | None = None) -> None:
        """Deliver what was sent (within `timeout`), then stop."""
        timeout = self.timeout if timeout is None else timeout
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=timeout)
        if self._deliveries is not None:
            self._deliveries.close()
        if self._waiter is not None:
            await self._waiter.close()
        self._producer = self._deliveries = self._waiter = None
