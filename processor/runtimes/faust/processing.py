"""A batch of the Faust agent's proposals, from their records to the table: each decided
in order against the table and what earlier outcomes not in it yet will write to it
(`Staged`: this batch's and those of the batches still travelling); their outcomes
delivered in two phases, every record but the snapshots, then the snapshots (each phase
sent at once, then awaited whole; the snapshots only once the batch before is
written); then written to the table; counted, measured and logged once delivered. The
order is what the runtime's guarantees rest on (app.py); the agent asks for this only
for records `positions` says to decide, and keeps batches travelling (inflight.py).
"""

import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from processor.engine import Beat, Commit, Forget
from processor.engine.answers import Answer, committed_digest
from processor.observe import traces
from processor.observe.logs import log_outcomes, logged
from processor.observe.metrics import MetricsBatch, WorkerMetrics
from processor.records.changelog_keys import answer_changelog_key, answers_changelog_prefix
from processor.records.intake import TimestampType
from processor.records.limits import RecordLimits
from processor.records.outputs import CommitLimits, OutputRecord, Source, publishable
from processor.records.pipeline import (
    Admitted,
    DeadLetterReason,
    Outcome,
    decide_admitted,
    outcome_run_id,
)
from processor.records.punctuator import Punctuator
from processor.records.stats import OutcomeStats
from processor.runtimes.admission import Admission, Admitting
from processor.runtimes.faust.observe import StateIndex
from processor.runtimes.faust.producer import Deliver, Sendable, sendable
from processor.runtimes.faust.snapshots import DecodedSnapshots
from processor.runtimes.faust.table import (
    NEXT_OFFSET_KEY,
    SOURCE_OFFSET_HEADER,
    NotHeld,
    RunsTable,
    TableWrites,
    proposal_key,
    proposals_prefix,
)
from processor.runtimes.faust.timers import DueIndex
from processor.runtimes.faust.transport import Unreadable
from processor.runtimes.settings import WorkerConfig
from processor.runtimes.verifier import BatchVerifier
from processor.serving.read_fence import ReadFence
from processor.trust.keyring import KeyringWatch
from schemas.messages import Proposal, Rejection, RunSnapshot

log = logging.getLogger("runstate.faust")


def last_offset(message: Any) -> int:
    """The last offset a record stands for: its own, or the last of a batch the
    consumer could not read (`transport`)."""
    checksum = message.checksum
    return checksum.last if isinstance(checksum, Unreadable) else int(message.offset)


def _key(record: OutputRecord) -> bytes:
    """A changelog record's key (every one has a key)."""
    assert record.key is not None
    return record.key


@dataclass
class Staged:
    """What a batch's outcomes will write to the table once delivered: runs by id (None:
    forgotten) and the table's other keys (None: dropped); `before`, the batch decided
    before it while that one's outcomes travel. A batch is read through the chain,
    newest first, down to the first batch `settled` (written, or given up)."""

    runs: dict[str, RunSnapshot | None] = field(default_factory=dict)
    keys: dict[bytes, bytes | None] = field(default_factory=dict)
    before: "Staged | None" = None
    settled: bool = False

    def chain(self) -> Iterator["Staged"]:
        staged: Staged | None = self
        while staged is not None and not staged.settled:
            yield staged
            staged = staged.before

    def run(self, run_id: str) -> tuple[bool, RunSnapshot | None]:
        """(staged at all, the run as staged)."""
        for staged in self.chain():
            if run_id in staged.runs:
                return True, staged.runs[run_id]
        return False, None

    def key(self, key: bytes) -> tuple[bool, bytes | None]:
        """(staged at all, the value as staged)."""
        for staged in self.chain():
            if key in staged.keys:
                return True, staged.keys[key]
        return False, None

    def live_keys(self, prefixes: tuple[bytes, ...]) -> list[bytes]:
        """The keys with one of `prefixes` that the chain leaves with a value."""
        seen: set[bytes] = set()
        live = []
        for staged in self.chain():
            for key, value in staged.keys.items():
                if key.startswith(prefixes) and key not in seen:
                    seen.add(key)
                    if value is not None:
                        live.append(key)
        return live

    def settle(self) -> None:
        """Its writes are in the table (or given up): read from there from now on."""
        self.settled = True
        self.before = None


@dataclass
class Prepared:
    """One record of a batch, decided: what to send before the snapshots, its snapshot,
    and what the table and the counters learn once it is delivered."""

    message: Any
    last: int  # its last offset (a batch the consumer could not read spans several)
    outcome: Outcome
    previous: RunSnapshot | None
    decision: Any  # the traced decision's span context, or None
    before_snapshot: list[Sendable]
    snapshot: OutputRecord | None  # sent last, naming its proposal's offset
    records: list[OutputRecord]  # the outcome's
    own: list[OutputRecord]  # this runtime's changelog records (dedupe, forgotten ids)


@dataclass
class Batch:
    """A batch decided, its outcomes to deliver (`Decision.complete`)."""

    prepared: list[Prepared]
    staged: Staged


class Decision:
    """Decides the agent's proposals, a batch per `decide`, against the runs table. The
    table is read and written in each record's partition (never through Faust's
    current event, which a batch of several partitions does not have)."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        partitions: int,
        limits: RecordLimits,
        runs: RunsTable,
        deliver: Deliver,
        punctuator: Punctuator,
        keyring: KeyringWatch,
        metrics: WorkerMetrics,
        stats: OutcomeStats,
        due_index: DueIndex,
        run_states: StateIndex,
        read_fence: ReadFence,
        delivered: Callable[[Any, int], None],
    ) -> None:
        """`delivered(message, last)`: the outcome of every offset of `message` up to
        `last` is delivered and in the table (the agent's positions learn it)."""
        self.config = config
        self.topics = config.topics
        self.partitions = partitions
        self.limits = limits
        self.commit_limits = CommitLimits(config.topics, limits)
        self.runs = runs
        self.deliver = deliver
        self.punctuator = punctuator
        self.keyring = keyring
        self.metrics = metrics
        self.stats = stats
        self.due_index = due_index
        self.run_states = run_states
        self.read_fence = read_fence
        self.delivered = delivered
        self.decoded = DecodedSnapshots()
        self.verifier = BatchVerifier()
        self._staged: Staged | None = None  # the newest batch's

    def prepare_batch(self, messages: Sequence[Any]) -> Batch | None:
        """Decide a batch of proposal records (or batches the consumer could not read),
        in order, each against the table and what was decided before it and is not in
        the table yet; None when no record is this worker's to decide."""
        # Only partitions whose store this worker holds: one revoked, or a worker
        # stopping (Faust drops the stores first), leaves its records to the next owner,
        # who decides them against the store restored with every write.
        messages = [m for m in messages if self.runs.holds(m.partition)]
        if not messages:
            return None
        before = self._staged if self._staged is not None and not self._staged.settled else None
        staged = self._staged = Staged(before=before)
        keyring = self.keyring.current()
        # A batch's Ed25519 signatures, verified on threads beforehand (verifier.py);
        # then the whole batch admitted before any of it is decided (admission.py).
        readable = [m for m in messages if not isinstance(m.checksum, Unreadable)]
        verified = self.verifier.verify(
            self.topics.proposals, ((m.key, m.value, m.headers) for m in readable), keyring
        )
        admitting = Admitting(
            keyring, self.partitions, self.config.settings.max_proposal_bytes, verified
        )
        admissions = [
            None if isinstance(m.checksum, Unreadable) else self._admit(admitting, m)
            for m in messages
        ]
        prepared = [
            self.prepare(message, staged, admission)
            for message, admission in zip(messages, admissions, strict=True)
        ]
        return Batch(prepared, staged)

    async def complete(self, batch: Batch, before: Awaitable[None] | None) -> None:
        """Deliver a batch's outcomes: every record but the snapshots at once; then, once
        `before` (the batch decided before it) is delivered and written, the snapshots;
        then the table. Whatever becomes of it, its staged writes are read no more."""
        prepared = batch.prepared
        sending = time.perf_counter()
        sending_ns = time.time_ns() if any(p.decision is not None for p in prepared) else 0
        # From the first output sent until the table has the outcomes, a reader who saw
        # one of those outputs waits for it (read_fence.py).
        fenced = self.read_fence.open()
        try:
            # A snapshot (the last changelog record of an outcome, naming its proposal's
            # offset: SOURCE_OFFSET_HEADER) is sent only once every other record of the
            # batch, and every record of the batches before, is acknowledged: a worker
            # that restores a snapshot finds every output of its proposal, and of the
            # proposals before it, delivered. A crash before the snapshots decides the
            # batch again, to the same outcomes (`committed_by`).
            await self.deliver([r for p in prepared for r in p.before_snapshot])
            if before is not None:
                await before
            await self.deliver([self._snapshot(p) for p in prepared if p.snapshot is not None])
            writes = TableWrites()
            marks: dict[int, int] = {}  # partition -> the offset after its last proposal
            for p in prepared:
                self._stored(p, writes)
                marks[p.message.partition] = p.last + 1
            # Each partition's mark once, in the same write batch as its outcomes.
            for partition, mark in marks.items():
                writes.put(partition, NEXT_OFFSET_KEY, str(mark).encode())
            written = self.runs.write(writes)
            # A partition dropped while its outcomes travelled is not vouched for: its
            # next owner decides them again, to the same outcomes.
            for p in prepared:
                if p.message.partition in written:
                    self.delivered(p.message, p.last)
        finally:
            batch.staged.settle()
            self.read_fence.close(fenced)
        decisions = [p.decision for p in prepared if p.decision is not None]
        if decisions:
            traces.committed(decisions, sending_ns)
        observed = MetricsBatch()
        for p in prepared:
            self.stats.count(p.outcome)
            observed.stage(p.previous, p.outcome)
        # Counted once acknowledged (this runtime's commit).
        self.metrics.committed(observed, time.perf_counter() - sending, len(prepared))
        logging_these = [p.outcome for p in prepared if logged(p.outcome)]
        if logging_these:
            log_outcomes(logging_these)  # acknowledged, at its level (logs.py)

    def _admit(self, admitting: Admitting, message: Any) -> Admission:
        return admitting.admit(
            self.topics.proposals,
            message.partition,
            message.offset,
            message.key,
            message.value,
            message.headers,
            round(message.timestamp * 1000),
            TimestampType.of_kafka(message.timestamp_type),
        )

    def prepare(self, message: Any, staged: "Staged", admission: Admission | None) -> "Prepared":
        """One record decided against the table and what the batch staged before it;
        its outcome's records, and what the table will hold once they are delivered."""
        topics, runs, metrics = self.topics, self.runs, self.metrics

        def looked_up(run_id: str) -> Any:
            found, run = staged.run(run_id)
            return run if found else self.snapshot_of(message.partition, run_id)

        def table_get(partition: int, key: bytes) -> bytes | None:
            found, value = staged.key(key)
            return value if found else runs.partition_read(partition, key)

        at_ms = round(message.timestamp * 1000)
        # A batch the consumer could not read (`transport`): one DLQ record for it,
        # naming its offsets and the reason; the partition goes on after it.
        unreadable = message.checksum if isinstance(message.checksum, Unreadable) else None
        last = last_offset(message)
        outcome: Outcome
        decision = None  # the traced decision's span (`traces.decided`)
        try:
            if unreadable is not None:
                outcome = DeadLetterReason(unreadable.reason)
            else:
                assert admission is not None  # every readable record is admitted
                began = time.perf_counter()
                began_ns = time.time_ns() if traces.tracing() else 0
                admitted = admission.admitted
                outcome = (
                    decide_admitted(
                        admitted,
                        at_ms,
                        machines=self.config.machines,
                        lookup=looked_up,
                        seen=partial(self.committed_by, message.partition, looked_up, table_get),
                        max_state_bytes=self.config.settings.max_state_bytes,
                        commit_limits=self.commit_limits,
                        max_relay_bytes=self.config.settings.max_proposal_bytes,
                        relays=self.punctuator.relays,
                    )
                    if isinstance(admitted, Admitted)
                    else admitted
                )
                metrics.decision.observe(admission.seconds + time.perf_counter() - began)
                if began_ns:
                    decision = traces.decided(
                        message.headers,
                        topics.proposals,
                        message.partition,
                        message.offset,
                        outcome,
                        began_ns,
                    )
        except NotHeld:  # not this worker's to answer (`decide` filters them out first)
            raise
        except Exception as exc:  # a bug must not stall the partition
            log.exception("deciding %s@%s failed", message.partition, message.offset)
            outcome = DeadLetterReason(f"internal error while deciding: {exc!r}")
        partition = message.partition
        source = Source(message.topic, partition, message.offset, message.key, message.value, at_ms)
        outcome, records = publishable(topics, outcome, source, self.limits, relay=self.relay)
        run_id = outcome_run_id(outcome)
        previous = looked_up(run_id) if run_id else None
        # This runtime's own changelog records go before the run's snapshot (or
        # tombstone, or remembered answer), which is always last: only that one names the
        # proposal's offset (SOURCE_OFFSET_HEADER), so a crash before it decides the
        # proposal again, and one after it finds everything written.
        own: list[OutputRecord] = []
        if isinstance(outcome, Commit):  # dedupe for the run's life
            t = outcome.transition
            answer = f"{t.revision} {committed_digest(t)}".encode()
            own.append(
                OutputRecord(topics.changelog, proposal_key(t.run_id, t.proposal_id), answer)
            )
        elif isinstance(outcome, Forget):  # its proposal ids and answers go with it
            forgotten = outcome.transition.run_id
            prefixes = (proposals_prefix(forgotten), answers_changelog_prefix(forgotten))
            in_table = [
                key for prefix in prefixes for key in runs.partition_keys(partition, prefix)
            ]
            # Staged by this batch or one travelling, not in the table yet.
            in_batch = [key for key in staged.live_keys(prefixes) if key not in in_table]
            own += [
                OutputRecord(topics.changelog, key, None)
                for key in [*in_table, *in_batch]
                if staged.key(key) != (True, None)
            ]
        snapshot = records[-1] if records and records[-1].topic == topics.changelog else None
        before = [*(records[:-1] if snapshot is not None else records), *own]
        # What the table will hold once delivered, for the records after it in the batch.
        for record in own:
            staged.keys[_key(record)] = record.value
        if isinstance(outcome, Forget):
            for record in records:
                if record.topic == topics.changelog:
                    staged.keys[_key(record)] = None
            staged.runs[outcome.transition.run_id] = None
        elif snapshot is not None:
            staged.keys[_key(snapshot)] = snapshot.value
            if isinstance(outcome, Commit | Beat):
                staged.runs[outcome.snapshot.run_id] = outcome.snapshot
        return Prepared(
            message=message,
            last=last,
            outcome=outcome,
            previous=previous,
            decision=decision,
            before_snapshot=[sendable(record, partition) for record in before],
            snapshot=snapshot,
            records=records,
            own=own,
        )

    @staticmethod
    def _snapshot(p: "Prepared") -> Sendable:
        """`p`'s snapshot as sent: naming its proposal's offset."""
        assert p.snapshot is not None
        offset = [(SOURCE_OFFSET_HEADER, str(p.message.offset).encode())]
        return sendable(p.snapshot, p.message.partition, offset)

    def _stored(self, p: "Prepared", writes: TableWrites) -> None:
        """What the table learns once `p`'s outcome is delivered, into `writes`: its own
        records, then its snapshot; a forgotten run's keys dropped. (The partition's
        mark goes in once a batch, after the last: `decide`.)"""
        partition, outcome = p.message.partition, p.outcome
        for record in p.own:
            if record.value is not None:
                writes.put(partition, _key(record), record.value)
        if isinstance(outcome, Forget):
            for record in [*p.records, *p.own]:
                if record.topic == self.topics.changelog:
                    writes.put(partition, _key(record), None)
            self.due_index.drop(partition, outcome.transition.run_id)
            self.decoded.drop(partition, outcome.transition.run_id)
            if p.previous is not None:
                self.run_states.drop(partition, p.previous)
        elif p.snapshot is not None:
            value = p.snapshot.value
            if value is not None:
                writes.put(partition, _key(p.snapshot), value)
            if isinstance(outcome, Commit | Beat):
                if value is not None:
                    self.decoded.put(partition, value, outcome.snapshot)
                self.due_index.note(partition, outcome.snapshot)
                self.run_states.note(partition, p.previous, outcome.snapshot)

    def relay(self, proposal: Proposal) -> OutputRecord:
        """A message to another run, signed now (the record's time must be fresh)."""
        return self.punctuator.relay(proposal, int(time.time() * 1000), self.partitions)

    def snapshot_of(self, partition: int, run_id: str) -> RunSnapshot | None:
        raw = self.runs.partition_read(partition, run_id.encode())
        return None if raw is None else self.decoded.decode(partition, run_id, raw)

    def committed_by(
        self,
        partition: int,
        current: Callable[[str], RunSnapshot | None],
        table_get: Callable[[int, bytes], bytes | None],
        run_id: str,
        proposal_id: str,
    ) -> Answer | None:
        """What the run answered `proposal_id`, for the run's life: the refusal it
        remembers, or the revision that committed it. A revision past
        the run's own is not a commit of it: an outcome's proposal-id record goes to the
        changelog before its snapshot (not in one transaction), and a crash between the
        two left the id recorded and the run unmoved. Taken as a commit, the proposal was
        refused `duplicate` when decided again, the run never took it, and the next
        proposal got its revision: two different transitions with one id (CI, SIGKILL)."""
        refused = table_get(partition, answer_changelog_key(run_id, proposal_id))
        if refused is not None:
            rejection = Rejection.model_validate_json(refused)
            return Answer(None, rejection.content_digest, rejection)
        raw = table_get(partition, proposal_key(run_id, proposal_id))
        if raw is None:
            return None
        revision, _, digest = bytes(raw).partition(b" ")
        run = current(run_id)
        if run is None or int(revision) > run.revision:
            return None
        return Answer(int(revision), digest.decode() or None)
