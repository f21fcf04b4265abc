"""Which partitions the native worker owns, as the group hands them out: their stores
restored beside the loop before they are resumed, let go on a revoke (after a commit)
or a loss (after an abort), and how far behind each owned one is.

A restored partition is resumed only once the consumer fetches it (its seek to the
committed offset is taken). librdkafka stamps each partition operation with a version
taken before it is queued, and drops one that reaches the partition after a newer
one: a resume that races the assignment's own start of the fetch can get the start
dropped, and the partition is then never fetched, silently (seen once: one partition
of three never read after a fresh assignment whose restore took 40 ms)."""

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from confluent_kafka import Consumer, TopicPartition

from processor.engine import is_finished
from processor.observe.metrics import WorkerMetrics
from processor.runtimes.errors import ClientBroken
from processor.runtimes.native.commits import CommitPipeline, rewind
from processor.runtimes.native.restore import RestoreJob
from processor.runtimes.native.statedir import StateDir
from processor.runtimes.native.store.partition import PartitionStore
from processor.runtimes.native.stores import StoreRegistry
from processor.runtimes.settings import WorkerConfig
from schemas.messages import RunSnapshot

log = logging.getLogger("runstate.worker")

#: How often a restored partition whose fetch has not started is looked at again.
FETCH_START_RETRY_S = 0.05
#: How long a restored partition may wait for its fetch to start before it is assigned
#: again (a start dropped for good: see above).
FETCH_START_PATIENCE_S = 10.0


class Restored(Protocol):
    """What the assignment counts (the worker's `WorkerStats`)."""

    restored_records: int


class Assignment:
    """The group's callbacks (`on_assign`, `on_revoke`, `on_lost`), the restores they
    start, and the owned partitions' lag. The loop calls `finish_restores` each turn."""

    def __init__(
        self,
        config: WorkerConfig,
        state_dir: StateDir,
        stores: StoreRegistry,
        commits: CommitPipeline,
        metrics: WorkerMetrics,
        counts: Restored,
    ) -> None:
        self.config = config
        self.topics = config.topics
        self.state_dir = state_dir
        self.stores = stores
        self.commits = commits
        self.metrics = metrics
        self.counts = counts
        self.restores: list[RestoreJob] = []
        #: Restored partitions, still paused until the consumer fetches them: partition
        #: -> since when (monotonic).
        self.starting: dict[int, float] = {}
        self._next_start_try = 0.0
        self.assigned = False  # has had an assignment (possibly empty) from the group
        self.lag: dict[int, int] = {}

    def _finished(self, snapshot: RunSnapshot) -> bool:
        """Whether a run has finished (its stores keep finished runs out of the cache)."""
        return is_finished(
            self.config.machines, snapshot.machine, snapshot.machine_version, snapshot.state
        )

    @property
    def restoring(self) -> list[int]:
        """Partitions not yet answered from: their stores restoring, or restored and
        waiting for the consumer to fetch them."""
        return sorted([p for job in self.restores for p in job.stores] + list(self.starting))

    # -- the group's callbacks -------------------------------------------------
    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Take the partitions, paused, and restore their stores beside the loop: a
        restore inside this callback held the loop, and one longer than
        max.poll.interval.ms cost the worker its place in the group."""
        assigned = sorted(tp.partition for tp in partitions)
        if not assigned:
            self.assigned = True
            return
        if self.config.settings.static_membership:  # eager: this is the whole assignment
            consumer.assign(partitions)
        else:
            consumer.incremental_assign(partitions)
        consumer.pause(partitions)
        new = {
            p: PartitionStore(self.state_dir.partition(p), finished=self._finished)
            for p in assigned
        }
        self.restores.append(RestoreJob(self.config.kafka, self.topics, new))
        self.assigned = True  # after the job is listed: /readyz must not see a gap
        self.metrics.restoring.set(1)
        log.info("assigned partitions %s: restoring their stores", assigned)

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Commit what was processed while the generation is still valid, then let go
        # (also when the commit failed for good: the partitions are not ours any more,
        # whatever the producer does next).
        with self.letting_go(partitions):
            self.commits.commit()

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another worker owns them already: our open transaction must not commit (a
        # commit in flight has its outcome applied, whichever it is, before the stores go).
        with self.letting_go(partitions):
            if self.commits.open:
                self.commits.abort("partitions lost")
            self.commits.stale_coordinator = True

    @contextmanager
    def letting_go(self, partitions: list[TopicPartition]) -> Iterator[None]:
        """Around what a rebalance callback does before the partitions go: they go (their
        restores cancelled, their stores dropped) whatever it raised."""
        try:
            yield
        except ClientBroken:  # the loop replaces the producer; nothing staged may stay
            self.commits.transaction = self.commits.new_transaction()
            raise
        finally:
            self.cancel_restores([tp.partition for tp in partitions])
            self._drop([tp.partition for tp in partitions])

    def _drop(self, partitions: list[int]) -> None:
        if self.commits.transaction is not None:
            self.commits.transaction.release(partitions)
        self.stores.drop(partitions)
        for p in partitions:
            self.lag.pop(p, None)
            self.starting.pop(p, None)
        if partitions:
            log.info("released partitions %s (now %s)", sorted(partitions), self.stores.owned())

    # -- restores --------------------------------------------------------------
    def finish_restores(self, consumer: Consumer) -> None:
        """Partitions whose restore is done join the owned ones, and are resumed from
        their committed offsets (anything fetched before the pause was not decided) once
        the consumer fetches them."""
        for job in [j for j in self.restores if j.done]:
            if job.error is not None:
                raise job.error
            self.metrics.restored.inc(job.applied)
            self.counts.restored_records += job.applied
            self.stores.add(job.stores)
            # After its stores are owned (no gap for /readyz), before anything that can
            # raise: a job left listed had its stores closed twice when the partitions went.
            self.restores.remove(job)
            now = time.monotonic()
            self.starting.update(dict.fromkeys(job.stores, now))
            self._next_start_try = 0.0
        if self.starting:
            self._resume_fetched(consumer)
        if not self.restores and not self.starting:
            self.metrics.restoring.set(0)

    def _resume_fetched(self, consumer: Consumer) -> None:
        """Resume the restored partitions whose seek to the committed offset is taken (the
        consumer fetches them); the others wait, and are assigned again if their fetch
        has not started after FETCH_START_PATIENCE_S."""
        now = time.monotonic()
        if now < self._next_start_try:
            return
        self._next_start_try = now + FETCH_START_RETRY_S
        waiting = set(rewind(consumer, self.topics.proposals, sorted(self.starting)))
        fetched = sorted(p for p in self.starting if p not in waiting)
        if fetched:
            consumer.resume([TopicPartition(self.topics.proposals, p) for p in fetched])
            for p in fetched:
                del self.starting[p]
            log.info("restored partitions %s (now %s)", fetched, self.stores.owned())
        stuck = sorted(p for p in waiting if now - self.starting[p] >= FETCH_START_PATIENCE_S)
        if stuck:
            self._assign_again(consumer, stuck)

    def _assign_again(self, consumer: Consumer, partitions: list[int]) -> None:
        """Partitions restored, but whose fetch has not started for FETCH_START_PATIENCE_S:
        unassigned and assigned again (paused), which starts their fetch anew. An eager
        (static) member cannot change one partition of its assignment: it says so."""
        waited = time.monotonic() - min(self.starting[p] for p in partitions)
        static = self.config.settings.static_membership
        log.warning(
            "partitions %s: restored, but the consumer has not fetched them for %.0f s; %s",
            partitions,
            waited,
            "they stay paused (restart the worker if this lasts)"
            if static
            else "assigning them again",
        )
        if static:
            for p in partitions:
                self.starting[p] = time.monotonic()  # said again after as long
            return
        tps = [TopicPartition(self.topics.proposals, p) for p in partitions]
        consumer.incremental_unassign(tps)
        consumer.incremental_assign(tps)
        consumer.pause(tps)
        for p in partitions:
            self.starting[p] = time.monotonic()

    def cancel_restores(self, partitions: list[int] | None = None) -> None:
        """Stop restoring `partitions` (all: None) and close their stores."""
        for job in list(self.restores):
            if partitions is None or set(job.stores) & set(partitions):
                job.cancel()
                self.restores.remove(job)
                keep = {p: s for p, s in job.stores.items() if partitions and p not in partitions}
                for p, store in job.stores.items():
                    if p not in keep:
                        store.close()
                if keep:  # the rest of that job's partitions are still ours
                    self.restores.append(RestoreJob(self.config.kafka, self.topics, keep))
        if not self.restores:
            self.metrics.restoring.set(0)

    def catch_up(self, consumer: Consumer) -> None:
        """The owned stores, out of reach, catch up from the changelog (only what they
        lack) before their partitions resume from the committed offsets: after the
        producer was replaced, the commit in flight may have gone through or not."""
        owned = self.stores.owned()
        for p in owned:
            self.starting.pop(p, None)  # resumed after the catch-up, like any restore
        if owned:
            consumer.pause([TopicPartition(self.topics.proposals, p) for p in owned])
            self.restores.append(
                RestoreJob(self.config.kafka, self.topics, self.stores.take(owned))
            )
            self.metrics.restoring.set(1)
            log.info("partitions %s catching up from the changelog", owned)

    # -- lag -------------------------------------------------------------------
    def measure_lag(self, consumer: Consumer) -> None:
        """Records behind per owned partition: the end of the partition (as of the
        latest fetch) minus the next offset to decide."""
        owned = [TopicPartition(self.topics.proposals, p) for p in self.stores.owned()]
        if not owned:
            return
        lag: dict[int, int] = {}
        for tp in consumer.position(owned):
            low, high = consumer.get_watermark_offsets(tp, cached=True)
            # No position yet: nothing fetched since assignment, all of it is ahead (for
            # the moment before the first fetch, an overstatement).
            start = tp.offset if tp.offset >= 0 else low
            if high >= 0 and start >= 0:
                lag[tp.partition] = max(0, high - start)
        self.lag = lag
