"""One proposal record in, one outcome out: decode, authenticate, decide, fit. Pure.

The worker runs this per record; replay, verification and tests run the very same
function over the proposals topic, which is why a replay reproduces every decision.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from processor.engine import Beat, Commit, Forget, Machine, Relay, decide
from processor.engine.answers import Answer, committed_digest, digest_of
from processor.engine.continuation import CONTINUED_BY, DETAIL_MAX_CHARS, GRANTED, undo
from processor.engine.decide import refused, remembered
from processor.kafka.partitioning import PARTITIONER_ADVICE, partition_for
from processor.records.intake import (
    DEFAULT_MAX_PROPOSAL_BYTES,
    Credential,
    Headers,
    TimestampType,
    Undecodable,
    Unproven,
    Verified,
    authenticate,
    decode_proposal,
    reject_unproven,
    untrusted_time,
)
from processor.trust.keyring import Keyring
from schemas.codes import RejectionCode
from schemas.messages import Proposal, Rejection, RunSnapshot, Transition

if TYPE_CHECKING:  # (outputs builds on this module: the limits come from the runtime)
    from processor.records.outputs import CommitLimits

#: Default limit on a commit's records (the run's snapshot and its transition, as JSON).
#: Kafka's clients and brokers take records of about 1 MB by default; this leaves room
#: for the key, headers and batch framing. Workers refuse to start on topics that
#: could not take records this large.
DEFAULT_MAX_STATE_BYTES = 900 * 1024


@dataclass(frozen=True, slots=True)
class DeadLetterReason:
    """The record is not a proposal; it goes to the DLQ with this reason."""

    reason: str


Outcome = Commit | Beat | Forget | Rejection | Relay | DeadLetterReason

#: (run id, proposal id) -> what the run answered that id, or None (never answered).
Seen = Callable[[str, str], Answer | None]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a record was read: its partition of the proposals topic, of how many."""

    partition: int
    partitions: int


@dataclass(frozen=True, slots=True)
class Admitted:
    """A record that is a proposal, keyed and placed as its run requires, from the
    principal its signature proves: what `decide_admitted` decides."""

    proposal: Proposal
    credential: Credential


def decide_record(
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    timestamp_ms: int,
    *,
    topic: str,
    keyring: Keyring,
    machines: Mapping[str, Machine],
    lookup: Callable[[str], RunSnapshot | None],
    seen: Seen,
    placement: Placement | None,
    max_bytes: int = DEFAULT_MAX_PROPOSAL_BYTES,
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    verified: Verified | None = None,
    timestamp_type: TimestampType = TimestampType.LOG_APPEND_TIME,
    commit_limits: "CommitLimits | None" = None,
    relays: bool = True,
) -> Outcome:
    """The outcome of one record of the proposals topic: `admit_record`, then
    `decide_admitted`.

    `timestamp_ms` is the record's broker timestamp and `topic` the topic it was read
    from (the signature covers it); `lookup` gives a run's current
    snapshot (None when it does not exist), `seen` what a run answered a proposal id,
    for the run's whole life (None: never); `placement` where the
    record was read (None where that is not known, e.g. a single record decided alone).
    A commit comes back
    with its records encoded (`Commit.encoded`), or refused `state_too_large` when
    either would be over `max_state_bytes`, or its records for a topic would not fit one
    batch of it (`commit_limits`, from the topics' limits; None: not checked).
    `verified`: Ed25519 verifications the
    runtime made beforehand (`intake.ed25519_claim`); the outcome is the same without.
    `timestamp_type`: who set `timestamp_ms` (`admit_record` decides nothing else by
    any but the broker's time). `relays`: whether the runtime signs with a processor key,
    which a continuation's messages between runs need (see `decide_admitted`).
    """
    admitted = admit_record(
        key,
        value,
        headers,
        timestamp_ms,
        topic=topic,
        keyring=keyring,
        placement=placement,
        max_bytes=max_bytes,
        verified=verified,
        timestamp_type=timestamp_type,
    )
    if not isinstance(admitted, Admitted):
        return admitted
    return decide_admitted(
        admitted,
        timestamp_ms,
        machines=machines,
        lookup=lookup,
        seen=seen,
        max_state_bytes=max_state_bytes,
        commit_limits=commit_limits,
        max_relay_bytes=max_bytes,
        relays=relays,
    )


def admit_record(
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    timestamp_ms: int,
    *,
    topic: str,
    keyring: Keyring,
    placement: Placement | None,
    max_bytes: int = DEFAULT_MAX_PROPOSAL_BYTES,
    verified: Verified | None = None,
    timestamp_type: TimestampType = TimestampType.LOG_APPEND_TIME,
) -> Admitted | Rejection | DeadLetterReason:
    """What a record is before any run's state is read: a proposal admitted to be
    decided, or its outcome already (not a proposal: the DLQ; a proposal with a wrong
    key, in the wrong partition, or not proven: a rejection). It depends on the record
    and the keyring alone, so a runtime may admit a whole batch before deciding it: the
    decoder's and the verifier's code then stay hot in the CPU's caches (on the 2-core
    benchmark machine, 20 % more signed records a second through these two functions
    than admitting and deciding each in turn; a native drain, +7 %, inside its noise).
    A record whose timestamp is not the broker's goes to the DLQ first (`untrusted_time`)."""
    untrusted = untrusted_time(timestamp_type, topic)
    if untrusted is not None:
        return DeadLetterReason(untrusted)
    decoded = decode_proposal(value, timestamp_ms, max_bytes)
    if isinstance(decoded, Undecodable):
        return DeadLetterReason(decoded.reason)
    if isinstance(decoded, Rejection):
        return decoded
    proposal: Proposal = decoded
    # Key and run must agree byte for byte: the key picks the partition, and so the
    # state store. (A lossy comparison let a key that differed only in invalid UTF-8
    # create the run in a second partition.)
    if key != proposal.run_id.encode():
        shown = "no key" if key is None else f"key {_shown(key)}"
        return Rejection(
            code=RejectionCode.SCHEMA_INVALID,
            detail=f"record has {shown}; the key must be the run_id '{proposal.run_id}' in UTF-8",
            run_id=proposal.run_id,
            proposal_id=proposal.proposal_id,
            event=proposal.event,
            at_ms=timestamp_ms,
        )
    # A run's state lives in the partition murmur2 of its key picks: a record elsewhere
    # (another partitioner; the topic grown since) would start a second copy of the run.
    if placement is not None:
        home = partition_for(proposal.run_id, placement.partitions)
        if home != placement.partition:
            return Rejection(
                code=RejectionCode.WRONG_PARTITION,
                detail=f"record is in partition {placement.partition} of "
                f"{placement.partitions}, but run '{proposal.run_id}' lives in partition "
                f"{home}; {PARTITIONER_ADVICE}",
                run_id=proposal.run_id,
                proposal_id=proposal.proposal_id,
                event=proposal.event,
                at_ms=timestamp_ms,
            )
    credential = authenticate(topic, key, value or b"", headers, keyring, timestamp_ms, verified)
    if isinstance(credential, Unproven):
        return reject_unproven(proposal, credential, timestamp_ms)
    return Admitted(proposal, credential)


def decide_admitted(
    admitted: Admitted,
    timestamp_ms: int,
    *,
    machines: Mapping[str, Machine],
    lookup: Callable[[str], RunSnapshot | None],
    seen: Seen,
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    commit_limits: "CommitLimits | None" = None,
    max_relay_bytes: int = DEFAULT_MAX_PROPOSAL_BYTES,
    relays: bool = True,
) -> Outcome:
    """An admitted proposal decided against its run's current state (see
    `decide_record`). A continuation asked of its original run is refused here when
    this runtime cannot send the ask (`relays` False: no processor key) or the ask would
    be over `max_relay_bytes` (the proposals' limit, which the original's worker holds
    it to)."""
    proposal, credential = admitted.proposal, admitted.credential
    run_id = proposal.run_id
    current = lookup(run_id)
    decision = decide(
        machines,
        current,
        proposal,
        credential.principal,
        timestamp_ms,
        lambda pid: seen(run_id, pid),
        credential.scope,
        credential.signed_at_ms,
    )
    if isinstance(decision, Relay) and decision.proposal.event == CONTINUED_BY:
        return _sendable(decision, proposal, credential, max_relay_bytes, relays, timestamp_ms)
    if isinstance(decision, Commit):
        fitted = fit_commit(decision, current, max_state_bytes, commit_limits)
        if isinstance(fitted, Rejection) and proposal.event == GRANTED:
            # A continuation granted that does not fit: its original is told to forget it.
            create = Proposal.model_validate(proposal.payload["create"])
            return Relay(undo(create), fitted)
        if isinstance(fitted, Rejection) and current is not None:
            # Decided, so the run's answer like any refusal; a creation refused is no
            # run's answer (the run does not exist: nothing may take its ids early).
            return remembered(fitted, digest_of(proposal, credential.principal))
        return fitted
    return decision


#: Room within the proposals' record limit for a relay's signature headers and, in the
#: original's answer, a refusal's detail (UTF-8: up to 4 bytes a character).
_RELAY_HEADROOM = 512 + 4 * DETAIL_MAX_CHARS


def _sendable(
    relay: Relay,
    proposal: Proposal,
    credential: Credential,
    max_bytes: int,
    relays: bool,
    timestamp_ms: int,
) -> Relay | Rejection:
    """The ask of a continuation, or the create's refusal when it cannot be sent."""
    if not relays:
        code, why = (
            RejectionCode.UNAUTHORIZED,
            "this worker cannot ask the original run: continuing a run takes a processor "
            'key (keyring "processor": true, authority runtime) for the workers to sign '
            "with (--timer-key-file; `runstate keys add --processor`)",
        )
    else:
        size = len(relay.proposal.model_dump_json(exclude_none=True)) + _RELAY_HEADROOM
        if size <= max_bytes:
            return relay
        code, why = (
            RejectionCode.CHECKPOINT_TOO_LARGE,
            f"asking the original run to be continued would take a record of {size} bytes; "
            f"the proposals' limit is {max_bytes}: carry a smaller checkpoint or smaller "
            "step results (large data belongs in your own storage, referenced by key)",
        )
    return refused(code, why, proposal, credential.principal, timestamp_ms)


def fit_commit(
    commit: Commit,
    current: RunSnapshot | None,
    limit: int,
    batches: "CommitLimits | None" = None,
) -> Commit | Rejection:
    """The commit with its records encoded, or `state_too_large` when one is over `limit`
    bytes, or when its records for a topic, with their keys, headers and framing, would
    not fit one batch of it (`batches`; None: not checked): the broker would refuse them,
    and the run stays as it was."""
    # model_dump_json's very bytes, from its serializer directly: model_dump_json
    # decodes them to text, which was encoded back here.
    transition = _TRANSITION_JSON(commit.transition)
    snapshot = _SNAPSHOT_JSON(commit.snapshot)
    t = commit.transition
    if len(transition) <= limit and len(snapshot) <= limit:
        over = None if batches is None else batches.overflow(commit, transition, snapshot)
        if over is None:
            # Built directly: NamedTuple._replace goes through a dict of the fields (4x slower).
            return Commit(commit.snapshot, commit.transition, (transition, snapshot), commit.sends)
        what = (
            f"{over.records} record(s) of {over.size} bytes together to topic {over.topic} "
            f"(with keys, headers and framing); one batch of it takes {over.limit} (its "
            "max.message.bytes, or the producer's message.max.bytes, less framing)"
        )
    else:
        name, size = (
            ("snapshot", len(snapshot))
            if len(snapshot) > limit
            else ("transition", len(transition))
        )
        what = f"a {name} of {size} bytes; the limit is {limit} (max state bytes)"
    kept = "nothing changes" if current is None else f"it stays at revision {current.revision}"
    return Rejection.trusted(
        dict(
            schema_version=1,
            code=RejectionCode.STATE_TOO_LARGE,
            detail=f"committing '{t.event}' would write {what}; {kept}. Record less (large "
            "step results, payloads or facts belong in your own storage, referenced by key)",
            run_id=t.run_id,
            proposal_id=t.proposal_id,
            event=t.event,
            principal=t.principal,
            state=None if current is None else current.state,
            revision=None if current is None else current.revision,
            original_transition_id=None,
            step_result=None,
            content_digest=None,
            at_ms=t.at_ms,
        )
    )


_TRANSITION_JSON = Transition.__pydantic_serializer__.to_json
_SNAPSHOT_JSON = RunSnapshot.__pydantic_serializer__.to_json


def outcome_run_id(outcome: Outcome) -> str | None:
    """The run an outcome is about, when it names one (a DLQ reason does not)."""
    if isinstance(outcome, Commit | Beat):
        return outcome.snapshot.run_id
    if isinstance(outcome, Forget):
        return outcome.transition.run_id
    if isinstance(outcome, Relay):  # nothing of the deciding run changes
        return None if outcome.refusal is None else outcome.refusal.run_id
    return getattr(outcome, "run_id", None)


def _shown(key: bytes) -> str:
    """A record key for a message: its text when it is short UTF-8, else its size."""
    if len(key) <= 300:
        try:
            return f"'{key.decode()}'"
        except UnicodeDecodeError:
            pass
    return f"of {len(key)} bytes ({key[:32]!r}...)"


@dataclass
class RunsInMemory:
    """Runs as a dict, for whoever decides records without a store (verify, replay
    checks, tests): the snapshots and every committed proposal id, kept as a store
    keeps them. Hand `lookup` and `seen` to `decide_record`, then `apply` its outcome."""

    snapshots: dict[str, RunSnapshot] = field(default_factory=dict)
    #: (run, proposal id) -> the transition that committed it, or the refusal remembered
    answers: dict[tuple[str, str], Transition | Rejection] = field(default_factory=dict)

    def lookup(self, run_id: str) -> RunSnapshot | None:
        return self.snapshots.get(run_id)

    def seen(self, run_id: str, proposal_id: str) -> Answer | None:
        found = self.answers.get((run_id, proposal_id))
        if isinstance(found, Transition):  # its digest when asked, as a store does
            return Answer(found.revision, committed_digest(found))
        return None if found is None else Answer(None, found.content_digest, found)

    def apply(self, outcome: Outcome) -> None:
        if isinstance(outcome, Forget):  # the run and its dedupe memory go
            run_id = outcome.transition.run_id
            self.snapshots.pop(run_id, None)
            for key in [k for k in self.answers if k[0] == run_id]:
                del self.answers[key]
            return
        if isinstance(outcome, Commit):
            t = outcome.transition
            self.answers[(t.run_id, t.proposal_id)] = t
        elif isinstance(outcome, Rejection) and outcome.content_digest is not None:
            self.answers[(outcome.run_id or "", outcome.proposal_id or "")] = outcome
        if isinstance(outcome, Commit | Beat):
            self.snapshots[outcome.snapshot.run_id] = outcome.snapshot
