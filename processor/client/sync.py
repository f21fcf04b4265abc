"""`RunstateClient`: the blocking face of the SDK (a producer of proposals, a scoped
outcome waiter on a thread, the workers' HTTP API)."""

import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from processor.engine.machine import Machine
from processor.history.resume import ResumeView, resume_view
from schemas.messages import RunSnapshot, Transition

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
    raw_proposal_id,
)
from .errors import Rejected
from .lookup import committed_transition
from .proposal_producer import Headers, ProposalProducer
from .steps import Step, T, run_step
from .waiter import OutcomeWaiter
from .watch import Position, Watch, run_watch, state_watch


class RunstateClient(ClientBase):
    """Create runs, propose (signed), wait for outcomes, read snapshots; blocking.

    Every call that talks to Kafka returns or raises within its `timeout` (default: the
    client's `timeout`, 30 s): `Unavailable` when the broker cannot be reached or a
    proposal not delivered, `Timeout` when no outcome came."""

    def _open(self) -> None:
        self._proposals = ProposalProducer(self.settings, self.topics.proposals, self.timeout)
        self._scoped: OutcomeWaiter | None = None
        self._all: OutcomeWaiter | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> "RunstateClient":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- proposing -------------------------------------------------------------
    def propose(
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
        """Send a signed proposal; returns its proposal id (give one to retry safely).
        Its outcome is registered for `wait()` before it is sent, so it is never missed.
        """
        record = self._record(
            run_id, event, payload, reason, expected_revision, metadata, proposal_id
        )
        self._send(record, Deadline(self.timeout if timeout is None else timeout))
        return record.proposal_id

    def _send(self, record: ProposalRecord, deadline: Deadline) -> None:
        self._expect(record.key, record.proposal_id, deadline)
        self._proposals.produce(record.key, record.value, record.headers)

    def _expect(self, key: bytes, proposal_id: str, deadline: Deadline) -> None:
        if self._all is not None:
            self._all.expect(key, proposal_id, deadline.left())
        else:
            self._scoped_waiter().expect(key, proposal_id, max(0.1, deadline.left()))

    def send_raw(
        self,
        key: bytes | None,
        value: bytes,
        headers: Headers | None = None,
    ) -> None:
        """Produce bytes to the proposals topic, signed unless `headers` are given.

        It never waits on the broker, so it pins no partition: when the bytes hold a
        proposal id and this client already follows the key's partition (it proposed
        for a run there), `wait()` gets its outcome as after `propose`; else start
        `waiter()` before sending, to wait for it."""
        if headers is None:
            headers = self.signing_key.headers(
                self.topics.proposals, key, value, int(time.time() * 1000)
            )
        proposal_id = raw_proposal_id(value)
        waiter = self._all or self._scoped
        if key is not None and proposal_id is not None and waiter is not None:
            waiter.expect_if_followed(key, proposal_id)
        self._proposals.produce(key, value, headers)

    def create(
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
        self._send(record, Deadline(self.timeout if timeout is None else timeout))
        return record.proposal_id

    def heartbeat(self, run_id: str, *, timeout: float | None = None) -> str:
        """A sign of life for a running run: pushes its heartbeat deadline back. Not a
        transition: the run's revision stays; its answer is a `Heartbeat`."""
        return self.propose(run_id, "heartbeat", timeout=timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every proposal sent is delivered; `Unavailable` when one could not
        be, or not within `timeout`."""
        self._proposals.flush(self.timeout if timeout is None else timeout)

    # -- outcomes --------------------------------------------------------------
    def _scoped_waiter(self) -> OutcomeWaiter:
        with self._lock:
            if self._scoped is None:
                self._scoped = OutcomeWaiter(
                    self.settings,
                    self.topics,
                    follow_all=False,
                    max_unclaimed=self.max_unclaimed,
                    timeout=self.timeout,
                )
            return self._scoped

    @property
    def outcomes(self) -> OutcomeWaiter:
        """The client's scoped waiter (what it follows and keeps)."""
        return self._scoped_waiter()

    def waiter(self) -> OutcomeWaiter:
        """A waiter that follows every partition of the output topics from now on, for
        tools and tests waiting for proposals others send (`send_raw`, other clients).
        An agent does not need it: `propose` registers its own proposals."""
        with self._lock:
            if self._all is None:
                self._all = OutcomeWaiter(
                    self.settings,
                    self.topics,
                    max_unclaimed=self.max_unclaimed,
                    timeout=self.timeout,
                )
            return self._all

    def wait(self, proposal_id: str, timeout: float | None = None) -> Outcome:
        """The proposal's outcome, once; for a proposal id the run committed before (a
        retry), the transition it committed then. `Timeout` when none came in time."""
        timeout = self.timeout if timeout is None else timeout
        deadline = Deadline(timeout)
        with self._awaiting(proposal_id) as note:
            scoped = self._scoped
            if scoped is not None and scoped.expecting(proposal_id):
                outcome = scoped.wait(proposal_id, timeout)
            elif self._all is not None:
                outcome = self._all.wait(proposal_id, timeout)
            else:
                outcome = self._scoped_waiter().wait(proposal_id, timeout)
            outcome = self._resolved(outcome, max(1.0, deadline.left()))
            note(outcome)
            return outcome

    def propose_and_wait(
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
        sent = self.propose(
            run_id,
            event,
            payload=payload,
            reason=reason,
            expected_revision=expected_revision,
            metadata=metadata,
            proposal_id=proposal_id,
            timeout=deadline.left(),
        )
        return self._deliver_and_wait(sent, deadline, raise_on_rejection)

    def create_and_wait(
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
        sent = self.create(
            run_id,
            machine,
            max_retries=max_retries,
            success_criteria=success_criteria,
            deadlines=deadlines,
            proposal_id=proposal_id,
            timeout=deadline.left(),
        )
        return self._deliver_and_wait(sent, deadline, raise_on_rejection)

    def decide(
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
        """An approver's decision on the run's approval wait: grant it, or deny it with
        `grant=False`; waits for the outcome. The decision names the pause it answers
        (`pause`: the revision of the transition that entered the wait; default: read
        from the run's snapshot, which needs worker URLs) and holds for `expires_in_ms`.
        `event`: the machine's decision event (default: the snapshot's machine's, or
        approval_granted / approval_denied when `pause` is given)."""
        deadline = Deadline(self.timeout if timeout is None else timeout)
        if pause is None:
            snapshot = self.snapshot(run_id)
            pause, event = pending_decision(run_id, snapshot, grant, event, machines)
        return self.propose_and_wait(
            run_id,
            event or decision_event(None, grant),
            payload=approval_payload(pause, expires_in_ms, self._now_ms()),
            reason=reason,
            metadata=metadata,
            proposal_id=proposal_id,
            timeout=deadline.left(),
            raise_on_rejection=raise_on_rejection,
        )

    def _deliver_and_wait(
        self, proposal_id: str, deadline: Deadline, raise_on_rejection: bool
    ) -> Outcome:
        self.flush(deadline.left())
        outcome = self.wait(proposal_id, deadline.left())
        return Rejected.raise_for(outcome) if raise_on_rejection else outcome

    def _resolved(self, outcome: Outcome, timeout: float) -> Outcome:
        """A `duplicate` (the proposal id was committed before) as the transition it
        names, so a retry gets the answer the first attempt got."""
        original = duplicate_of(outcome)
        found = None if original is None else self.transition(*original, timeout=timeout)
        outcome = outcome if found is None else found
        self.reader.saw(outcome)
        return outcome

    def transition(
        self, run_id: str, transition_id: str, timeout: float = 30.0
    ) -> Transition | None:
        """A committed transition of the run, by id: from a worker's API when given
        worker URLs, else from the run's partition of the transitions topic."""
        partitions = self._scoped_waiter().partitions(timeout)
        return committed_transition(
            self.reader, self.settings, self.topics, partitions, run_id, transition_id, timeout
        )

    # -- reads -----------------------------------------------------------------
    def snapshot(self, run_id: str) -> RunSnapshot | None:
        """The run's committed snapshot, from the owning worker (None: no such run)."""
        return self.reader.snapshot(run_id)

    get = snapshot

    def resume(
        self, run_id: str, machines: Mapping[str, Machine] | None = None
    ) -> ResumeView | None:
        """What a restarted agent rebuilds its context from (None: no such run): the
        run's state, completed steps with results, steps left `executing` (outcome
        unknown: check before redoing), failed steps, checkpoint data, pending deadlines
        and the events it may send next. `machines`: the workers' catalog (default: the
        built-in machines)."""
        snapshot = self.snapshot(run_id)
        if snapshot is None:
            return None
        return resume_view(snapshot, self.history(run_id), catalog(machines))

    def continue_run(
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
        payload = continuation(predecessor, self.snapshot(predecessor), machines)
        return self.propose_and_wait(
            run_id,
            "create",
            payload=payload,
            timeout=timeout,
            raise_on_rejection=raise_on_rejection,
        )

    def history(self, run_id: str) -> list[Transition]:
        return self.reader.history(run_id)

    def step(
        self,
        run_id: str,
        name: str,
        *,
        key: str,
        call_id: str | None = None,
        timeout: float | None = None,
    ) -> Step:
        """A side effect done at most once: `with client.step(...) as step`, the body
        doing it unless `step.done` (processor/client/steps.py). `key`: the side
        effect's idempotency key, as its tool knows it; `call_id`: the tool call."""
        return Step(self, run_id, name, key, call_id, timeout)

    def run_step(
        self,
        run_id: str,
        name: str,
        action: Callable[[], T],
        *,
        key: str,
        call_id: str | None = None,
        timeout: float | None = None,
    ) -> T:
        """`action()` as step `name` of the run, unless the step succeeded before: then
        its stored result, without calling `action`."""
        step = self.step(run_id, name, key=key, call_id=call_id, timeout=timeout)
        return run_step(step, action)

    def watch(
        self, run_id: str, *, resume_from: Position | None = None, since_ms: int | None = None
    ) -> Watch:
        """The run's transitions as they commit: `for t in client.watch(run_id)`; resume
        a watch from its `position` (processor/client/watch.py)."""
        return run_watch(self.settings, self.topics, run_id, resume_from, since_ms, self.timeout)

    def watch_state(
        self, state: str, *, machine: str | None = None, resume_from: Position | None = None
    ) -> Watch:
        """The transitions into `state` as they commit, from now or from `resume_from`."""
        return state_watch(self.settings, self.topics, state, machine, resume_from, self.timeout)

    def close(self, timeout: float | None = None) -> None:
        """Deliver what was sent (within `timeout`), then stop following outcomes."""
        self._proposals.close(self.timeout if timeout is None else timeout)
        for waiter in (self._scoped, self._all):
            if waiter is not None:
                waiter.close()
        self._scoped = self._all = None
