"""The SDK's two clients over a `RunstateEnvironment` instead of Kafka: the same
methods, from the clients themselves (propose, create, decide, steps, resume,
continue_run, ...); only the transport is replaced. A proposal is decided when it is
sent, so waiting never blocks: an outcome is there, or the proposal has none
(`Timeout`, saying why)."""

import asyncio
from typing import TYPE_CHECKING

from processor.client.aio import AsyncRunstateClient
from processor.client.core import Deadline, Outcome, ProposalRecord, duplicate_of
from processor.client.errors import Rejected, Timeout
from processor.client.sync import RunstateClient
from processor.client.waiter import OutcomeWaiter
from processor.client.watch import AsyncWatch, Position, Watch
from processor.kafka.config import KafkaSettings
from processor.records.outputs import Headers
from processor.trust.keyring import SigningKey
from schemas.messages import RunSnapshot, Transition

from .watches import AsyncLogWatch, run_log_watch, state_log_watch

if TYPE_CHECKING:
    from .environment import RunstateEnvironment

#: Where a test client's Kafka is: nowhere (no client of the environment connects).
IN_PROCESS = KafkaSettings("in-process:0")


def _answer(env: "RunstateEnvironment", proposal_id: str) -> Outcome:
    """The proposal's outcome; for a retry of a committed proposal id, the transition
    it committed then (as the SDK's clients answer)."""
    try:
        outcome = env.take(proposal_id)
    except LookupError as exc:
        raise Timeout(str(exc)) from None
    original = duplicate_of(outcome)
    found = None if original is None else env.transition(*original)
    return outcome if found is None else found


class AsyncTestClient(AsyncRunstateClient):
    """An `AsyncRunstateClient` of a `RunstateEnvironment`."""

    def __init__(self, env: "RunstateEnvironment", signing_key: SigningKey) -> None:
        self._env = env
        super().__init__(IN_PROCESS, env.topics, signing_key=signing_key)

    def _now_ms(self) -> int:
        return self._env.now_ms

    async def __aenter__(self) -> "AsyncTestClient":
        return self

    async def _send(self, record: ProposalRecord, deadline: Deadline) -> "asyncio.Future[None]":
        self._env.submit(record.key, record.value, record.headers)
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        delivered.set_result(None)
        return delivered

    async def wait(self, proposal_id: str, timeout: float | None = None) -> Outcome:
        with self._awaiting(proposal_id) as note:
            outcome = _answer(self._env, proposal_id)
            note(outcome)
            return outcome

    async def _deliver_and_wait(
        self, record: ProposalRecord, deadline: Deadline, raise_on_rejection: bool
    ) -> Outcome:
        await self._send(record, deadline)
        outcome = await self.wait(record.proposal_id)
        return Rejected.raise_for(outcome) if raise_on_rejection else outcome

    async def transition(
        self, run_id: str, transition_id: str, timeout: float = 30.0
    ) -> Transition | None:
        return self._env.transition(run_id, transition_id)

    async def snapshot(self, run_id: str) -> RunSnapshot | None:
        return self._env.snapshot(run_id)

    get = snapshot

    async def history(self, run_id: str) -> list[Transition]:
        return self._env.history(run_id)

    def watch(
        self, run_id: str, *, resume_from: Position | None = None, since_ms: int | None = None
    ) -> AsyncWatch:
        return AsyncLogWatch(self._env, run_log_watch(self._env, run_id, resume_from, since_ms))

    def watch_state(
        self, state: str, *, machine: str | None = None, resume_from: Position | None = None
    ) -> AsyncWatch:
        return AsyncLogWatch(self._env, state_log_watch(self._env, state, machine, resume_from))

    async def flush(self, timeout: float | None = None) -> None:
        return None

    async def close(self, timeout: float | None = None) -> None:
        return None


class TestClient(RunstateClient):
    """A blocking `RunstateClient` of a `RunstateEnvironment`."""

    __test__ = False  # a client, not a test class for pytest to collect

    def __init__(self, env: "RunstateEnvironment", signing_key: SigningKey) -> None:
        self._env = env
        super().__init__(IN_PROCESS, env.topics, signing_key=signing_key)

    def _open(self) -> None:
        self._scoped: OutcomeWaiter | None = None
        self._all: OutcomeWaiter | None = None

    def _now_ms(self) -> int:
        return self._env.now_ms

    def _send(self, record: ProposalRecord, deadline: Deadline) -> None:
        self._env.submit(record.key, record.value, record.headers)

    def send_raw(self, key: bytes | None, value: bytes, headers: Headers | None = None) -> None:
        """Bytes as a record of the proposals topic, signed unless `headers` are given:
        decided now, its outcome waited for with `wait` (if it has a proposal id)."""
        if headers is None:
            headers = self.signing_key.headers(self.topics.proposals, key, value, self._now_ms())
        self._env.submit(key, value, headers)

    def wait(self, proposal_id: str, timeout: float | None = None) -> Outcome:
        with self._awaiting(proposal_id) as note:
            outcome = _answer(self._env, proposal_id)
            note(outcome)
            return outcome

    def _deliver_and_wait(
        self, proposal_id: str, deadline: Deadline, raise_on_rejection: bool
    ) -> Outcome:
        outcome = self.wait(proposal_id)
        return Rejected.raise_for(outcome) if raise_on_rejection else outcome

    def transition(
        self, run_id: str, transition_id: str, timeout: float = 30.0
    ) -> Transition | None:
        return self._env.transition(run_id, transition_id)

    def snapshot(self, run_id: str) -> RunSnapshot | None:
        return self._env.snapshot(run_id)

    get = snapshot

    def history(self, run_id: str) -> list[Transition]:
        return self._env.history(run_id)

    def watch(
        self, run_id: str, *, resume_from: Position | None = None, since_ms: int | None = None
    ) -> Watch:
        return run_log_watch(self._env, run_id, resume_from, since_ms)

    def watch_state(
        self, state: str, *, machine: str | None = None, resume_from: Position | None = None
    ) -> Watch:
        return state_log_watch(self._env, state, machine, resume_from)

    def flush(self, timeout: float | None = None) -> None:
        return None

    def close(self, timeout: float | None = None) -> None:
        return None
