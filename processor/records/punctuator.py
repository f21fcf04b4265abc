"""Timers as records: every due timer of a partition fires once. A deadline becomes a
runtime-signed proposal on the proposals topic, an alert a record on the alerts topic,
and the mark that it fired goes to the changelog in the same transaction, so no restart
fires it again. Driven by any runtime with "now" and a partition's store."""

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from processor.engine.lint import TIMER_AUTHORITY
from processor.engine.timers import timer_proposal_id
from processor.kafka.partitioning import partition_for
from processor.kafka.topics import TopicNames
from processor.records.changelog_keys import FIRED_CHANGELOG_PREFIX
from processor.records.outputs import OutputRecord
from processor.runtimes.errors import WorkerError
from processor.trust.keyring import Keyring, KeyringError, SigningKey, load_signing_key
from processor.trust.signatures import ed25519_public_key
from schemas.messages import Alert, Proposal, RunSnapshot, Timer

log = logging.getLogger("runstate.worker")


def _mark(name: str, due_ms: int) -> str:
    # The due time is part of a timer's identity: a heartbeat moves the heartbeat
    # deadline without a new revision, and the moved deadline must fire again.
    return f"{name}@{due_ms}"


@dataclass(frozen=True)
class Fired:
    """Timers already fired for a run at `revision` (older revisions' marks are moot),
    each named with its due time."""

    revision: int
    names: frozenset[str]

    def covers(self, revision: int, name: str, due_ms: int) -> bool:
        return self.revision == revision and _mark(name, due_ms) in self.names

    def with_name(self, revision: int, name: str, due_ms: int) -> "Fired":
        names = self.names if self.revision == revision else frozenset()
        return Fired(revision, names | {_mark(name, due_ms)})

    def encode(self) -> bytes:
        return json.dumps({"revision": self.revision, "names": sorted(self.names)}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Fired":
        data = json.loads(raw)
        return cls(int(data["revision"]), frozenset(data["names"]))


NOT_FIRED = Fired(-1, frozenset())


class TimerState(Protocol):
    """A partition's runs and fired marks as a runtime sees them (staged changes included)."""

    def snapshot(self, run_id: str) -> RunSnapshot | None: ...

    def fired(self, run_id: str) -> Fired: ...

    def stage_fired(self, run_id: str, revision: int, name: str, due_ms: int) -> Fired:
        """Mark the timer fired; the marks of the run at that revision, to write."""
        ...


def timer_key(keyring: Keyring, key_id: str | None, key_file: Path | None) -> SigningKey:
    """The key that signs the proposals deadlines become, and the messages runs exchange
    (`Relay`): the signing key in `key_file` (an Ed25519 keyring holds no private keys),
    else the HMAC key `key_id` of the keyring, else its first HMAC processor key with
    authority 'runtime', else its first HMAC key with that authority. It must be a
    runtime key of the keyring, or every deadline would be refused; only a processor key
    ("processor": true) carries continuations."""
    if key_file is not None:
        try:
            signing = load_signing_key(key_file)
        except KeyringError as exc:
            raise WorkerError(str(exc)) from exc
        entry = keyring.keys.get(signing.key_id)
        if entry is None or entry.authority != TIMER_AUTHORITY:
            raise WorkerError(
                f"the timer key '{signing.key_id}' ({key_file}) is not a key with authority "
                f"'{TIMER_AUTHORITY}' in the keyring; add it (runstate keys add)"
            )
        if entry.public_key is not None and (
            signing.private_key is None
            or ed25519_public_key(signing.private_key) != entry.public_key
        ):
            raise WorkerError(
                f"the timer key {key_file} does not match the public key of "
                f"'{signing.key_id}' in the keyring"
            )
        return signing
    candidates = (
        [key_id]
        if key_id is not None
        # Never an operator's key: deadlines need the runtime's authority, not theirs.
        # A processor key first: it also carries the messages runs exchange.
        else [
            k
            for k, e in sorted(keyring.keys.items(), key=lambda kv: (not kv[1].processor, kv[0]))
            if e.authority == TIMER_AUTHORITY and not e.operator
        ]
    )
    for name in candidates:
        entry = keyring.keys.get(name)
        if entry is None:
            raise WorkerError(f"--timer-key-id {name} is not in the keyring")
        if entry.secret is not None:
            return SigningKey.hmac(name, entry.secret)
    raise WorkerError(
        f"no key to sign deadlines with: give --timer-key-file (RUNSTATE_TIMER_KEY_FILE), "
        f"a signing key with authority '{TIMER_AUTHORITY}', or keep an HMAC runtime key in "
        "the keyring"
    )


@dataclass(frozen=True, slots=True)
class Firing:
    """A timer that fell due: the records to produce (the deadline's proposal or the
    alert, then the fired mark), in the transaction that stages the mark."""

    snapshot: RunSnapshot
    timer: Timer
    records: list[OutputRecord]

    @property
    def is_deadline(self) -> bool:
        return self.timer.kind == "deadline"

    def log(self) -> None:
        """The line a fired timer leaves: INFO for a deadline, WARNING for an alert."""
        snapshot, timer = self.snapshot, self.timer
        if self.is_deadline:
            log.info(
                "deadline %s of %s (revision %d) fired: proposing %s",
                timer.name,
                snapshot.run_id,
                timer.revision,
                timer.event,
            )
        else:
            log.warning("alert %s: run %s in %s", timer.name, snapshot.run_id, snapshot.state)


class Punctuator:
    def __init__(
        self, topics: TopicNames, timer_key: SigningKey, keyring: Keyring | None = None
    ) -> None:
        """`timer_key` is a runtime key that signs deadlines, and relays when the
        `keyring` makes it a processor key."""
        self.topics = topics
        self.timer_key = timer_key
        entry = None if keyring is None else keyring.keys.get(timer_key.key_id)
        #: Whether this worker can carry messages between runs (a processor key).
        self.relays = entry is not None and entry.processor is True
        # Runs whose stored snapshot could not be read: said once, not on every tick.
        self._unreadable: set[str] = set()

    def fire(self, now_ms: int, store: TimerState, due_runs: Iterable[str]) -> Iterator[Firing]:
        """Every timer of `due_runs` (the runs of the partition with a timer due at
        `now_ms`; more is harmless) that is due and has not fired, marked fired in
        `store` as it is yielded."""
        for run_id in due_runs:
            try:
                snapshot = store.snapshot(run_id)
            except Exception:  # one unreadable run must not crash-loop the worker
                if run_id not in self._unreadable:
                    self._unreadable.add(run_id)
                    log.exception(
                        "run %s: its snapshot in the store could not be read, so its timers "
                        "do not fire; its proposals go to the DLQ with the reason",
                        run_id,
                    )
                continue
            if snapshot is None:
                continue
            for timer in snapshot.timers:
                if timer.due_at_ms > now_ms or store.fired(run_id).covers(
                    timer.revision, timer.name, timer.due_at_ms
                ):
                    continue
                records: list[OutputRecord] = []
                try:
                    if timer.kind == "deadline":
                        records.append(self.deadline(snapshot, timer, now_ms))
                    else:
                        records.append(self.alert(snapshot, timer, now_ms))
                except Exception:  # a bug must not crash-loop the worker on one timer
                    log.exception(
                        "timer %s of run %s could not fire; marked fired, not retried",
                        timer.name,
                        run_id,
                    )
                marks = store.stage_fired(run_id, timer.revision, timer.name, timer.due_at_ms)
                key = FIRED_CHANGELOG_PREFIX + run_id.encode()
                records.append(OutputRecord(self.topics.changelog, key, marks.encode()))
                yield Firing(snapshot, timer, records)

    def relay(self, proposal: Proposal, now_ms: int, partitions: int) -> OutputRecord:
        """A message to another run (`Relay`, `Commit.sends`), signed at `now_ms`, to
        that run's partition of the proposals topic's `partitions`."""
        record = self._signed(proposal, now_ms)
        return record._replace(partition=partition_for(proposal.run_id, partitions))

    def _signed(self, proposal: Proposal, now_ms: int) -> OutputRecord:
        value = proposal.model_dump_json(exclude_none=True).encode()
        key = proposal.run_id.encode()
        return OutputRecord(
            self.topics.proposals,
            key,
            value,
            self.timer_key.headers(self.topics.proposals, key, value, now_ms),
        )

    def deadline(self, snapshot: RunSnapshot, timer: Timer, now_ms: int) -> OutputRecord:
        assert timer.event is not None
        proposal = Proposal(
            proposal_id=timer_proposal_id(snapshot.run_id, timer.revision, timer.name),
            run_id=snapshot.run_id,
            event=timer.event,
            reason=timer.reason,
            # Anything that happened to the run since (an approval; a heartbeat, which
            # moves the deadline) wins: the deadline is then refused revision_conflict.
            expected_revision=timer.revision,
            metadata={"timer": timer.name, "due_at_ms": timer.due_at_ms},
        )
        return self._signed(proposal, now_ms)

    def alert(self, snapshot: RunSnapshot, timer: Timer, now_ms: int) -> OutputRecord:
        alert = Alert(
            run_id=snapshot.run_id,
            machine=snapshot.machine,
            rule=timer.name,
            state=snapshot.state,
            revision=snapshot.revision,
            retry_count=snapshot.retry_count,
            time_in_state_ms=max(0, now_ms - snapshot.entered_state_at_ms),
            due_at_ms=timer.due_at_ms,
            at_ms=now_ms,
        )
        return OutputRecord(
            self.topics.alerts, snapshot.run_id.encode(), alert.model_dump_json().encode()
        )
