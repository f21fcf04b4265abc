"""A runstate in the test's own process: the worker's decision path with no Kafka, no
threads and a clock the test moves.

Every proposal a client of the environment sends is decided at once by the function
the workers run per record (`pipeline.decide_record`: the signature checked against a
keyring of the standard principals, the schema, the run's dedupe memory, the engine),
against runs kept as a worker's stores keep them (`RunsInMemory`). Time stands still
until the test moves it: `advance` fires every deadline and alert that falls due on
the way, each at its due time, through the workers' punctuator (its proposals signed
with the workers' key and decided like any other).
"""

import asyncio
import json
import time
from collections import deque
from collections.abc import Mapping
from datetime import timedelta

from processor.engine import Beat, Commit, Forget, Machine, Relay
from processor.kafka.topics import TopicNames
from processor.records.outputs import Headers, OutputRecord
from processor.records.pipeline import DeadLetterReason, RunsInMemory, decide_record
from processor.records.punctuator import NOT_FIRED, Fired, Punctuator
from processor.trust.keygen import PROCESSOR_KEY_ID, generate_keys
from processor.trust.keyring import SigningKey
from processor.trust.signatures import Algorithm
from schemas.messages import Alert, Heartbeat, Rejection, RunSnapshot, Transition

from .clients import AsyncTestClient, TestClient

Answer = Transition | Heartbeat | Rejection


class RunstateEnvironment:
    """Runs decided in process, for unit tests of agents:

        env = RunstateEnvironment()
        client = env.client()                      # an AsyncRunstateClient
        await client.create_and_wait("r1", "task_lifecycle", deadlines={...})
        await env.advance(hours=2)                 # the approval times out

    `machines`: the workers' catalog (default: the built-in machines). `start_ms`: the
    clock's start (default: now). Clients sign with keys of the standard principals
    (`runtime`, `tool`, `model`, `approver`, `operator`), as `runstate keys generate`
    makes them."""

    def __init__(
        self, machines: Mapping[str, Machine] | None = None, *, start_ms: int | None = None
    ) -> None:
        if machines is None:
            from processor.machines import builtin_machines

            machines = builtin_machines()
        self.machines = dict(machines)
        self.keyring, self.signing_keys = generate_keys(Algorithm.HMAC_SHA256)
        self.topics = TopicNames.with_prefix("env.")
        self.now_ms = int(time.time() * 1000) if start_ms is None else start_ms
        #: Alerts raised, oldest first; records the workers would send to the DLQ.
        self.alerts: list[Alert] = []
        self.dead_letters: list[str] = []
        #: Every transition committed, in commit order (what the watches read).
        self.log: list[Transition] = []
        #: Async watches waiting for the next commit.
        self.waiting: list[asyncio.Event] = []
        self._runs = RunsInMemory()
        self._histories: dict[str, list[Transition]] = {}
        self._fired: dict[str, Fired] = {}
        self._answers: dict[str, Answer] = {}
        self._dead: dict[str, str] = {}  # proposal id -> why its record is no proposal
        self._punctuator = Punctuator(
            self.topics, self.signing_keys[PROCESSOR_KEY_ID], self.keyring
        )

    # -- clients -----------------------------------------------------------------
    def client(self, key_id: str = "runtime") -> AsyncTestClient:
        """An `AsyncRunstateClient` of this environment, signing as `key_id`."""
        return AsyncTestClient(self, self._key(key_id))

    def blocking_client(self, key_id: str = "runtime") -> TestClient:
        """A `RunstateClient` of this environment, signing as `key_id`."""
        return TestClient(self, self._key(key_id))

    def _key(self, key_id: str) -> SigningKey:
        try:
            return self.signing_keys[key_id]
        except KeyError:
            known = ", ".join(sorted(self.signing_keys))
            raise ValueError(f"no key '{key_id}' here; the keys are {known}") from None

    # -- time ----------------------------------------------------------------------
    async def advance(
        self, *, hours: float = 0, minutes: float = 0, seconds: float = 0, ms: int = 0
    ) -> None:
        """Move the clock on, firing each timer as it falls due on the way."""
        self.advance_blocking(hours=hours, minutes=minutes, seconds=seconds, ms=ms)

    def advance_blocking(
        self, *, hours: float = 0, minutes: float = 0, seconds: float = 0, ms: int = 0
    ) -> None:
        """`advance`, for tests without an event loop."""
        span = timedelta(hours=hours, minutes=minutes, seconds=seconds, milliseconds=ms)
        if span < timedelta(0):
            raise ValueError("the clock only moves on")
        until = self.now_ms + int(span.total_seconds() * 1000)
        while (due := self._next_due(until)) is not None:
            self.now_ms = max(self.now_ms, due)
            self._fire_due()
        self.now_ms = until

    def _next_due(self, until: int) -> int | None:
        dues = [
            timer.due_at_ms
            for run_id, snapshot in self._runs.snapshots.items()
            for timer in snapshot.timers
            if timer.due_at_ms <= until
            and not self.fired(run_id).covers(timer.revision, timer.name, timer.due_at_ms)
        ]
        return min(dues, default=None)

    def _fire_due(self) -> None:
        due = [
            run_id
            for run_id, snapshot in self._runs.snapshots.items()
            if any(timer.due_at_ms <= self.now_ms for timer in snapshot.timers)
        ]
        queue: deque[OutputRecord] = deque()
        for firing in self._punctuator.fire(self.now_ms, self, due):
            for record in firing.records:
                if record.topic == self.topics.proposals:
                    queue.append(record)
                elif record.topic == self.topics.alerts and record.value is not None:
                    self.alerts.append(Alert.model_validate_json(record.value))
        self._decide_all(queue)

    # The punctuator's view of the runs (`TimerState`).
    def snapshot(self, run_id: str) -> RunSnapshot | None:
        """The run as committed (None: no such run)."""
        return self._runs.lookup(run_id)

    def fired(self, run_id: str) -> Fired:
        return self._fired.get(run_id, NOT_FIRED)

    def stage_fired(self, run_id: str, revision: int, name: str, due_ms: int) -> Fired:
        marks = self.fired(run_id).with_name(revision, name, due_ms)
        self._fired[run_id] = marks
        return marks

    # -- proposals -------------------------------------------------------------------
    def submit(self, key: bytes | None, value: bytes, headers: Headers | None) -> None:
        """A record of the proposals topic: decided now, with what it leads to (messages
        between runs, timers due now)."""
        self._decide_all(deque([OutputRecord(self.topics.proposals, key, value, headers)]))
        self._fire_due()

    def _decide_all(self, queue: deque[OutputRecord]) -> None:
        while queue:
            record = queue.popleft()
            outcome = decide_record(
                record.key,
                record.value,
                record.headers or [],
                self.now_ms,
                topic=self.topics.proposals,
                keyring=self.keyring,
                machines=self.machines,
                lookup=self._runs.lookup,
                seen=self._runs.seen,
                placement=None,
            )
            self._runs.apply(outcome)
            if isinstance(outcome, Commit):
                transition = outcome.transition
                self._histories.setdefault(transition.run_id, []).append(transition)
                self.log.append(transition)
                self._answers[transition.proposal_id] = transition
                sends = outcome.sends
            elif isinstance(outcome, Forget):
                self._histories.pop(outcome.transition.run_id, None)
                self._fired.pop(outcome.transition.run_id, None)
                self._answers[outcome.transition.proposal_id] = outcome.transition
                sends = ()
            elif isinstance(outcome, Beat):
                self._answers[outcome.heartbeat.proposal_id] = outcome.heartbeat
                sends = ()
            elif isinstance(outcome, Rejection):
                self._answers[outcome.proposal_id or ""] = outcome
                sends = ()
            elif isinstance(outcome, Relay):
                if outcome.refusal is not None:
                    self._answers[outcome.refusal.proposal_id or ""] = outcome.refusal
                sends = (outcome.proposal,)
            else:
                self._dead_letter(record, outcome)
                sends = ()
            for proposal in sends:
                queue.append(self._punctuator.relay(proposal, self.now_ms, 1))
        waiting, self.waiting = self.waiting, []
        for committed in waiting:
            committed.set()

    def _dead_letter(self, record: OutputRecord, outcome: DeadLetterReason) -> None:
        self.dead_letters.append(outcome.reason)
        try:
            proposal_id = json.loads(record.value or b"").get("proposal_id")
        except (ValueError, AttributeError):
            return
        if isinstance(proposal_id, str):
            self._dead[proposal_id] = outcome.reason

    def take(self, proposal_id: str) -> Answer:
        """The proposal's outcome, handed over once; LookupError when it has none (the
        record went to the DLQ, or it was never sent or already taken)."""
        answer = self._answers.pop(proposal_id, None)
        if answer is not None:
            return answer
        why = self._dead.get(proposal_id)
        if why is not None:
            raise LookupError(f"proposal '{proposal_id}' went to the DLQ: {why}")
        raise LookupError(
            f"proposal '{proposal_id}' has no outcome here: it was not sent to this "
            "environment, or its outcome was already taken"
        )

    # -- reads -------------------------------------------------------------------------
    def history(self, run_id: str) -> list[Transition]:
        """The run's transitions, oldest first."""
        return list(self._histories.get(run_id, ()))

    def transition(self, run_id: str, transition_id: str) -> Transition | None:
        return next(
            (t for t in self._histories.get(run_id, ()) if t.transition_id == transition_id),
            None,
        )
