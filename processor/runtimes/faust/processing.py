"""One proposal of the Faust agent, from its record to the table: decided, its outcome
delivered record by record (each acknowledged before the next), then written to the
table; counted, measured and logged once delivered. The order is what the runtime's
guarantees rest on (app.py); the agent asks for this only for a record `positions` says
to decide.
"""

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, cast

from faust.types import TopicT

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
    DeadLetterReason,
    Outcome,
    Placement,
    decide_record,
    outcome_run_id,
)
from processor.records.punctuator import Punctuator
from processor.records.stats import OutcomeStats
from processor.runtimes.faust.observe import StateIndex
from processor.runtimes.faust.table import (
    SOURCE_OFFSET_HEADER,
    RunsTable,
    proposal_key,
    proposals_prefix,
)
from processor.runtimes.faust.timers import DueIndex
from processor.runtimes.faust.transport import Unreadable
from processor.runtimes.settings import WorkerConfig
from processor.serving.read_fence import ReadFence
from processor.trust.keyring import KeyringWatch
from schemas.messages import Proposal, Rejection, RunSnapshot

log = logging.getLogger("runstate.faust")


class Decision:
    """Decides the agent's proposals, one `decide` per record, against the runs table."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        partitions: int,
        limits: RecordLimits,
        runs: RunsTable,
        outputs: Mapping[str, TopicT],
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
        `last` is delivered (the agent's positions and the table's local mark)."""
        self.config = config
        self.topics = config.topics
        self.partitions = partitions
        self.limits = limits
        self.commit_limits = CommitLimits(config.topics, limits)
        self.runs = runs
        self.outputs = outputs
        self.punctuator = punctuator
        self.keyring = keyring
        self.metrics = metrics
        self.stats = stats
        self.due_index = due_index
        self.run_states = run_states
        self.read_fence = read_fence
        self.delivered = delivered

    async def decide(self, message: Any) -> None:
        """Decide one proposal record (or a batch the consumer could not read) and
        deliver its outcome."""
        topics, runs, metrics = self.topics, self.runs, self.metrics
        seen: dict[str, RunSnapshot | None] = {}

        def looked_up(run_id: str, seen: dict[str, RunSnapshot | None] = seen) -> Any:
            """The run as the engine saw it (kept: the metrics' previous state)."""
            if run_id not in seen:
                seen[run_id] = self.snapshot_of(run_id)
            return seen[run_id]

        at_ms = round(message.timestamp * 1000)
        # A batch the consumer could not read (`transport`): one DLQ record for it,
        # naming its offsets and the reason; the partition goes on after it.
        unreadable = message.checksum if isinstance(message.checksum, Unreadable) else None
        last = message.offset if unreadable is None else unreadable.last
        outcome: Outcome
        decision = None  # the traced decision's span (`traces.decided`)
        try:
            if unreadable is not None:
                outcome = DeadLetterReason(unreadable.reason)
            else:
                began = time.perf_counter()
                began_ns = time.time_ns() if traces.tracing() else 0
                outcome = decide_record(
                    message.key,
                    message.value,
                    message.headers,
                    at_ms,
                    topic=topics.proposals,
                    keyring=self.keyring.current(),
                    machines=self.config.machines,
                    lookup=looked_up,
                    seen=partial(self.committed_by, message.partition, looked_up),
                    placement=Placement(message.partition, self.partitions),
                    max_bytes=self.config.settings.max_proposal_bytes,
                    max_state_bytes=self.config.settings.max_state_bytes,
                    timestamp_type=TimestampType.of_kafka(message.timestamp_type),
                    commit_limits=self.commit_limits,
                    relays=self.punctuator.relays,
                )
                metrics.decision.observe(time.perf_counter() - began)
                if began_ns:
                    decision = traces.decided(
                        message.headers,
                        topics.proposals,
                        message.partition,
                        message.offset,
                        outcome,
                        began_ns,
                    )
        except Exception as exc:  # a bug must not stall the partition
            log.exception("deciding %s@%s failed", message.partition, message.offset)
            outcome = DeadLetterReason(f"internal error while deciding: {exc!r}")
        partition = message.partition
        source = Source(message.topic, partition, message.offset, message.key, message.value, at_ms)
        outcome, records = publishable(topics, outcome, source, self.limits, relay=self.relay)
        # Each record delivered (awaited) before the next, the transition before its
        # snapshot, and all before the offset can be committed. Faust's own
        # `runs[key] = ...` sends the changelog record whenever its buffer drains,
        # possibly after the offset is committed; a crash there lost the record, and
        # recovery replayed older ones over the newer store.
        run_id = outcome_run_id(outcome)
        previous = looked_up(run_id) if run_id else None
        # This runtime's own changelog records go before the run's snapshot (or
        # tombstone), which is always last: only that one names the proposal's offset
        # (SOURCE_OFFSET_HEADER), so a crash before it decides the proposal again,
        # and one after it finds everything written.
        own: list[OutputRecord] = []
        if isinstance(outcome, Commit):  # dedupe for the run's life
            t = outcome.transition
            answer = f"{t.revision} {committed_digest(t)}".encode()
            own.append(
                OutputRecord(topics.changelog, proposal_key(t.run_id, t.proposal_id), answer)
            )
        elif isinstance(outcome, Forget):  # its proposal ids and answers go with it
            run_id = outcome.transition.run_id
            own += [
                OutputRecord(topics.changelog, key, None)
                for prefix in (proposals_prefix(run_id), answers_changelog_prefix(run_id))
                for key in runs.partition_keys(partition, prefix)
            ]
        if own:
            records = [*records[:-1], *own, records[-1]]
        sending = time.perf_counter()
        sending_ns = time.time_ns() if decision is not None else 0
        # From the first output sent until the table has the outcome, a reader
        # who saw that output waits for it (read_fence.py).
        fenced = self.read_fence.open()
        try:
            snapshot: OutputRecord | None = None
            for n, record in enumerate(records):
                headers = None
                if record.topic == topics.changelog and n == len(records) - 1:
                    snapshot = record
                    headers = [(SOURCE_OFFSET_HEADER, str(message.offset).encode())]
                elif record.partition is not None:  # a message to another run, signed
                    headers = cast(Any, record.headers)
                sent = await self.outputs[record.topic].send(
                    key=record.key,
                    value=record.value,
                    partition=partition if record.partition is None else record.partition,
                    headers=headers,
                )
                await sent
            for record in own:
                if record.value is not None:
                    runs.data[record.key] = record.value
            # The mark before the snapshot: a crash between them leaves the snapshot to
            # recovery, which replays every changelog record since the last one.
            self.delivered(message, last)
            if decision is not None:
                traces.committed([decision], sending_ns)
            if isinstance(outcome, Forget):
                for record in records:
                    if record.topic == topics.changelog:
                        runs.data.pop(record.key, None)
                self.due_index.drop(partition, outcome.transition.run_id)
                if previous is not None:
                    self.run_states.drop(partition, previous)
            elif snapshot is not None:
                runs.data[snapshot.key] = snapshot.value
                if isinstance(outcome, Commit | Beat):
                    self.due_index.note(partition, outcome.snapshot)
                    self.run_states.note(partition, previous, outcome.snapshot)
        finally:
            self.read_fence.close(fenced)
        self.stats.count(outcome)
        # Counted once acknowledged (this runtime's commit), one proposal at a time.
        observed = MetricsBatch()
        observed.stage(previous, outcome)
        metrics.committed(observed, time.perf_counter() - sending, 1)
        if logged(outcome):
            log_outcomes([outcome])  # acknowledged, at its level (logs.py)

    def relay(self, proposal: Proposal) -> OutputRecord:
        """A message to another run, signed now (the record's time must be fresh)."""
        return self.punctuator.relay(proposal, int(time.time() * 1000), self.partitions)

    def snapshot_of(self, run_id: str) -> RunSnapshot | None:
        raw_value = self.runs.get(run_id.encode())
        return None if raw_value is None else RunSnapshot.model_validate_json(raw_value)

    def committed_by(
        self,
        partition: int,
        current: Callable[[str], RunSnapshot | None],
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
        refused = self.runs.partition_get(partition, answer_changelog_key(run_id, proposal_id))
        if refused is not None:
            rejection = Rejection.model_validate_json(refused)
            return Answer(None, rejection.content_digest, rejection)
        raw = self.runs.partition_get(partition, proposal_key(run_id, proposal_id))
        if raw is None:
            return None
        revision, _, digest = bytes(raw).partition(b" ")
        run = current(run_id)
        if run is None or int(revision) > run.revision:
            return None
        return Answer(int(revision), digest.decode() or None)
