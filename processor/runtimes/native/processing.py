"""What the native worker's loop does with each record it takes and each due timer: the
outcome decided (pure, processor/records/pipeline.py), encoded as records that fit their
topics, produced into the open transaction and staged for its stores."""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Message

from processor.engine import Beat, Commit, Forget
from processor.observe import traces
from processor.observe.metrics import WorkerMetrics
from processor.records.outputs import SMALL, OutputRecord, Source, publishable
from processor.records.pipeline import (
    Admitted,
    DeadLetterReason,
    Outcome,
    decide_admitted,
    outcome_run_id,
)
from processor.records.punctuator import Punctuator
from processor.records.stats import OutcomeStats
from processor.runtimes.admission import Admission
from processor.runtimes.native.commits import CommitPipeline
from processor.runtimes.native.poison import Quarantine
from processor.runtimes.native.store.changes import PartitionTransaction
from processor.runtimes.native.stores import StoreRegistry
from processor.runtimes.settings import WorkerConfig
from schemas.messages import Proposal, Rejection

log = logging.getLogger("runstate.worker")


@dataclass
class WorkerStats(OutcomeStats):
    """What the native worker counts: outcomes and timers fired (`OutcomeStats`), and its
    transactions, aborts and records restored."""

    transactions: int = 0
    aborts: int = 0
    restored_records: int = 0


class Processing:
    """Records and due timers into the open transaction of `commits`."""

    def __init__(
        self,
        config: WorkerConfig,
        commits: CommitPipeline,
        stores: StoreRegistry,
        quarantine: Quarantine,
        punctuator: Punctuator,
        metrics: WorkerMetrics,
        stats: WorkerStats,
        partitions: Callable[[], int],
    ) -> None:
        self.config = config
        self.topics = config.topics
        self.commits = commits
        self.stores = stores
        self.quarantine = quarantine
        self.punctuator = punctuator
        self.metrics = metrics
        self.stats = stats
        self._partitions = partitions

    def record(self, msg: Message, admission: Admission) -> None:
        """One record taken by the loop: decided, produced and staged (a record the
        quarantine isolates in a transaction of its own)."""
        partition = msg.partition() or 0
        transaction = self.commits.transaction
        assert transaction is not None
        offset = msg.offset() or 0
        isolated = self.quarantine.isolating(partition, offset)
        if isolated and transaction.open:
            aborts = self.stats.aborts
            self.commits.commit()  # what came before goes in a transaction of its own
            if self.stats.aborts != aborts:
                return
            transaction = self.commits.transaction
            assert transaction is not None
        store = transaction.store(partition)
        if store is None:  # fetched before a revoke; not ours any more
            return
        _, timestamp = msg.timestamp()
        source = Source(msg.topic() or "", partition, offset, msg.key(), msg.value(), timestamp)
        began = time.perf_counter()
        began_ns = time.time_ns() if traces.tracing() else 0
        outcome = self._decide(store, source, admission.admitted)
        self.metrics.decision.observe(admission.seconds + time.perf_counter() - began)
        if began_ns:
            decision = traces.decided(
                msg.headers(), source.topic, partition, offset, outcome, began_ns
            )
            if decision is not None:
                transaction.traced.append(decision)
        # A poisoned record's DLQ record stays small: it must fit whatever the broker takes.
        limits = (
            self.commits.limits if self.quarantine.poisoned(partition, offset) is None else SMALL
        )
        answers = (
            store.answer_keys(outcome.transition.run_id) if isinstance(outcome, Forget) else ()
        )
        outcome, records = publishable(self.topics, outcome, source, limits, answers, self._relay)
        run_id = outcome_run_id(outcome)
        transaction.observed.stage(store.snapshot(run_id) if run_id else None, outcome)
        transaction.decided(outcome)
        # In the batch before producing: a produce refused at once names this record.
        transaction.consumed(partition, offset)
        for record in records:
            transaction.produce(record, partition if record.partition is None else record.partition)
        if isinstance(outcome, Rejection) and outcome.run_id and store.snapshot(outcome.run_id):
            store.stage_refusal(outcome, records[0].value)  # for the run's inspector page
        if isinstance(outcome, Commit):
            store.stage(outcome, records[0].value, records[-1].value)
        elif isinstance(outcome, Beat):
            store.stage_beat(outcome, records[-1].value)
        elif isinstance(outcome, Forget):
            store.stage_forget(outcome.transition.run_id)
        self.stats.count(outcome)
        if isolated:
            self.commits.commit()

    def _relay(self, proposal: Proposal) -> OutputRecord:
        """A message to another run, signed now (the record's time must be fresh)."""
        return self.punctuator.relay(proposal, int(time.time() * 1000), self._partitions())

    def _decide(
        self, store: PartitionTransaction, source: Source, admitted: Admitted | Outcome
    ) -> Outcome:
        poisoned = self.quarantine.poisoned(source.partition, source.offset)
        if poisoned is not None:
            return DeadLetterReason(
                f"the broker refused this record's outcome {self.quarantine.attempts} times "
                f"({poisoned}); set aside so that the partition goes on"
            )
        if not isinstance(admitted, Admitted):
            return admitted
        try:
            return decide_admitted(
                admitted,
                source.timestamp_ms,
                machines=self.config.machines,
                lookup=store.snapshot,
                seen=store.seen,
                max_state_bytes=self.config.settings.max_state_bytes,
                commit_limits=self.commits.commit_limits,
                max_relay_bytes=self.config.settings.max_proposal_bytes,
                relays=self.punctuator.relays,
            )
        except Exception as exc:  # a bug must not turn one record into a stalled partition
            log.exception(
                "deciding %s[%s]@%s failed", source.topic, source.partition, source.offset
            )
            return DeadLetterReason(f"internal error while deciding: {exc!r}")

    def timers(self, now_ms: int) -> None:
        """Fire every due timer once, into the open transaction (see punctuator.py)."""
        transaction = self.commits.transaction
        assert transaction is not None
        for partition in self.stores.owned():
            store = transaction.store(partition)
            if store is None:
                continue
            for firing in self.punctuator.fire(now_ms, store, store.store.due_runs(now_ms)):
                for record in firing.records:
                    transaction.produce(record, partition)
                transaction.records += 1
                firing.log()
                self.stats.fired(firing)
                if not firing.is_deadline:
                    transaction.observed.stage_alert(firing.snapshot.machine, firing.timer.name)
