"""The SDK's core, with no I/O of its own: shared by `RunstateClient` (threads) and
`AsyncRunstateClient` (asyncio).

It builds and signs proposal records, says which output partitions answer a run, reads
an outcome record, tells a `duplicate` (a retry of a committed proposal) from other
rejections, and keeps the book of which proposal ids someone waits for.
"""

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from processor.engine.machine import Machine
from processor.history.resume import continuation_payload
from processor.kafka.config import KafkaSettings
from processor.kafka.partitioning import murmur2
from processor.kafka.topics import TopicNames
from processor.trust.keyring import SigningKey
from schemas.codes import RejectionCode
from schemas.messages import Heartbeat, Proposal, Rejection, RunSnapshot, Transition

from .errors import InvalidArgument, NotFound, Unavailable

Outcome = Transition | Heartbeat | Rejection

# How many outcomes of proposals nobody has waited for yet are kept, by default.
MAX_UNCLAIMED = 10_000


@dataclass(frozen=True)
class ProposalRecord:
    """One signed record for the proposals topic."""

    proposal_id: str
    run_id: str
    key: bytes
    value: bytes
    headers: list[tuple[str, str | bytes | None]]


def proposal_record(
    topics: TopicNames,
    signing_key: SigningKey,
    run_id: str,
    event: str,
    *,
    payload: dict[str, Any] | None = None,
    reason: str | None = None,
    expected_revision: int | None = None,
    metadata: dict[str, Any] | None = None,
    proposal_id: str | None = None,
    now_ms: int | None = None,
) -> ProposalRecord:
    """The record to produce, signed now (a retry signs again, with the same id)."""
    try:
        proposal = Proposal(
            proposal_id=proposal_id or uuid.uuid4().hex,
            run_id=run_id,
            event=event,
            reason=reason,
            expected_revision=expected_revision,
            payload=payload or {},
            metadata=metadata or {},
        )
    except ValidationError as exc:
        raise InvalidArgument.of(exc, "proposal") from None
    key = run_id.encode()
    value = proposal.model_dump_json(exclude_none=True).encode()
    signed_at = int(time.time() * 1000) if now_ms is None else now_ms
    headers = signing_key.headers(topics.proposals, key, value, signed_at)
    return ProposalRecord(proposal.proposal_id, run_id, key, value, headers)


def create_payload(
    machine: str,
    *,
    max_retries: int | None = None,
    success_criteria: list[str] | None = None,
    deadlines: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The payload of a `create` proposal."""
    options: dict[str, Any] = {}
    if max_retries is not None:
        options["max_retries"] = max_retries
    if success_criteria is not None:
        options["success_criteria"] = success_criteria
    if deadlines is not None:
        options["deadlines"] = deadlines
    return {"machine": machine, "options": options}


def output_topics(topics: TopicNames) -> tuple[str, str, str]:
    """The topics a proposal's outcome can be on."""
    return (topics.transitions, topics.rejections, topics.heartbeats)


def answering_partitions(topics: TopicNames, key: bytes, partitions: int) -> list[tuple[str, int]]:
    """Where the outcomes of a proposal keyed `key` (a run id's bytes) are published:
    the worker writes them to the proposal's partition number of each output topic
    (they share the proposals topic's partition count), the murmur2 partition of the
    key."""
    p = (murmur2(key) & 0x7FFFFFFF) % partitions
    return [(topic, p) for topic in output_topics(topics)]


def raw_proposal_id(value: bytes | None) -> str | None:
    """The proposal id in a record's bytes, when they are a JSON object with one. Any
    bytes at all: a hostile record (50,000 nested arrays, an integer of 5,000 digits,
    invalid UTF-8) is None, never an error (the fault harness sends such records)."""
    if not value:
        return None
    try:
        data = json.loads(value)
    except (ValueError, RecursionError):
        return None
    pid = data.get("proposal_id") if isinstance(data, dict) else None
    return pid if isinstance(pid, str) else None


def parse_outcome(topics: TopicNames, topic: str, value: bytes) -> Outcome:
    if topic == topics.transitions:
        return Transition.model_validate_json(value)
    if topic == topics.heartbeats:
        return Heartbeat.model_validate_json(value)
    return Rejection.model_validate_json(value)


def duplicate_of(outcome: Outcome) -> tuple[str, str] | None:
    """(run_id, transition_id) of the original transition when the outcome says the
    proposal id was committed before; None for any other outcome."""
    if (
        isinstance(outcome, Rejection)
        and outcome.code is RejectionCode.DUPLICATE
        and outcome.original_transition_id is not None
        and outcome.run_id is not None
    ):
        return outcome.run_id, outcome.original_transition_id
    return None


class OutcomeBook:
    """The proposal ids someone waits for, and their outcomes until taken.

    An outcome is kept only when its proposal id was registered (`expect`) before it was
    read, or when `keep_all` (a waiter that follows every partition for tools, where
    callers wait for ids they never registered). Taking an outcome forgets it. At most
    `capacity` ids are held: past that the oldest is forgotten (an agent that proposes
    without ever waiting does not grow the book)."""

    def __init__(self, capacity: int = MAX_UNCLAIMED, *, keep_all: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self.keep_all = keep_all
        self._entries: OrderedDict[str, Outcome | None] = OrderedDict()
        self.dropped = 0  # outcomes read that nobody had registered
        self.forgotten = 0  # ids pushed out by the capacity

    def expect(self, proposal_id: str) -> None:
        if proposal_id in self._entries:
            self._entries.move_to_end(proposal_id)
            return
        self._entries[proposal_id] = None
        self._trim()

    def expecting(self, proposal_id: str) -> bool:
        return proposal_id in self._entries

    def wanted(self, proposal_id: str | None) -> bool:
        """Whether an outcome of this id would be kept: worth parsing."""
        return proposal_id is not None and (self.keep_all or proposal_id in self._entries)

    def offer(self, outcome: Outcome) -> bool:
        """Keep the outcome if someone waits (or may wait) for it; True when kept. The
        first outcome of an id wins (a later `duplicate` of a retry stays out)."""
        pid = outcome.proposal_id
        if pid is None:
            self.dropped += 1
            return False
        if pid in self._entries:
            if self._entries[pid] is None:
                self._entries[pid] = outcome
            return True
        if self.keep_all:
            self._entries[pid] = outcome
            self._trim()
            return True
        self.dropped += 1
        return False

    def take(self, proposal_id: str) -> Outcome | None:
        """The outcome, forgotten as it is handed over; None while none arrived."""
        outcome = self._entries.get(proposal_id)
        if outcome is not None:
            del self._entries[proposal_id]
        return outcome

    def forget(self, proposal_id: str) -> None:
        self._entries.pop(proposal_id, None)

    def __len__(self) -> int:
        return len(self._entries)

    def _trim(self) -> None:
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
            self.forgotten += 1


def producer_config(settings: KafkaSettings, timeout: float) -> dict[str, Any]:
    return settings.client(
        {
            "enable.idempotence": True,
            # The Java client's default for keyed records: every producer of a run must
            # choose the same partition.
            "partitioner": "murmur2_random",
        },
        defaults={
            "linger.ms": 5,
            # librdkafka retries a delivery for 5 minutes by default: give up when the
            # caller would, so a dead broker is reported, not waited on.
            "message.timeout.ms": max(1, int(timeout * 1000)),
        },
    )


def consumer_config(settings: KafkaSettings) -> dict[str, Any]:
    """A consumer that assigns partitions itself: never joins a group, never commits."""
    return settings.client(
        {
            "group.id": f"runstate-client-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )


def unavailable(settings: KafkaSettings, doing: str, timeout: float, cause: object) -> Unavailable:
    return Unavailable(
        f"Kafka at {settings.bootstrap_servers} did not answer while {doing} within "
        f"{timeout:.1f}s ({cause}): is the broker running, and are the bootstrap servers "
        "right (the SDK's KafkaSettings; the CLI's --bootstrap-servers or "
        "RUNSTATE_BOOTSTRAP_SERVERS)?"
    )


def timeout_message(proposal_id: str, timeout: float) -> str:
    return (
        f"no outcome for proposal '{proposal_id}' within {timeout:.1f}s; is a worker "
        "running (runstate worker) and consuming the proposals topic? Wait again, or "
        "send it again with the same proposal id (safe)"
    )


class Deadline:
    """The time left of one call's timeout, across the steps it takes."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._end = time.monotonic() + timeout

    def left(self) -> float:
        return max(0.0, self._end - time.monotonic())


#: How long an approver's decision holds by default: long enough to reach the broker.
DECISION_TTL_MS = 10 * 60 * 1000


def approval_payload(
    pause: int, expires_in_ms: int = DECISION_TTL_MS, now_ms: int | None = None
) -> dict[str, int]:
    """The payload of an approver's decision: the revision that entered the pause it
    answers, and until when (broker time, from `now_ms`, default this host's clock) it
    holds."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return {"pause": pause, "expires_at_ms": now_ms + expires_in_ms}


def decision_event(machine: Machine | None, grant: bool) -> str:
    """The machine's event that grants (or denies) an approval; without a machine, the
    usual names approval_granted / approval_denied."""
    kind = "grant" if grant else "deny"
    if machine is not None:
        for name, spec in sorted(machine.events.items()):
            if spec.approval == kind:
                return name
        raise ValueError(f"machine '{machine.name}' has no event that decides ({kind}) approvals")
    return "approval_granted" if grant else "approval_denied"


def pending_decision(
    run_id: str,
    snapshot: RunSnapshot | None,
    grant: bool,
    event: str | None,
    machines: Mapping[str, Machine] | None,
) -> tuple[int, str]:
    """The pause a decision on the run answers (the revision that entered its approval
    wait) and the event that decides it, from the run's snapshot; NotFound when there
    is no run or it waits for no approval."""
    if snapshot is None:
        raise NotFound(f"no run '{run_id}' to decide on")
    if snapshot.pause is None:
        raise NotFound(
            f"run '{run_id}' waits for no approval (state '{snapshot.state}'); decide once "
            "it asks for one"
        )
    machine = catalog(machines).get(snapshot.machine)
    return snapshot.pause.revision, event or decision_event(machine, grant)


def continuation(
    predecessor: str, snapshot: RunSnapshot | None, machines: Mapping[str, Machine] | None
) -> dict[str, Any]:
    """The create payload of a run continuing `predecessor` (its snapshot given)."""
    if snapshot is None:
        raise NotFound(f"no run '{predecessor}' to continue")
    return continuation_payload(snapshot, catalog(machines))


def catalog(machines: Mapping[str, Machine] | None) -> Mapping[str, Machine]:
    """The machines a resume view or a continuation is read against: those given (the
    workers' own, with versions), else the built-in ones (loaded only when asked)."""
    if machines is not None:
        return machines
    from processor.machines import builtin_machines

    return builtin_machines()
