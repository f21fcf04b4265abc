"""Rebuild from the transitions topic: a worker's partition stores (and the changelog),
or one run as it stood at a time or offset. The refusals runs remember come from the
rejections topic.

The Kafka side of `runstate replay` and `runstate get --at`: read the transitions,
decide each again with the pure `processor.history.replay.apply_transitions`, then write the
stores and republish their snapshots to the changelog. No printing, no options: the
CLI shows the progress and the results.
"""

import dataclasses
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from pydantic import ValidationError

from processor.engine import Machine
from processor.engine.lint import FORGET_EVENT
from processor.history.replay import Replayed, ReplayProblem, apply_heartbeats, apply_transitions
from processor.kafka.config import KafkaSettings
from processor.kafka.partitioning import partition_for
from processor.kafka.readback import offset_for_time, read_partition
from processor.kafka.topic_creation import provision_topics
from processor.kafka.topic_plans import TopicDefaults
from processor.kafka.topics import TopicNames
from processor.records.changelog_keys import (
    INDEX_HEADER,
    REVISION_HEADER,
    answer_changelog_key,
    history_changelog_key,
    revision_header,
    snapshot_index,
)
from processor.runtimes.native.statedir import StateDir
from schemas.messages import Heartbeat, Rejection, RunSnapshot, Transition

log = logging.getLogger("runstate.rebuild")


class RebuildError(RuntimeError):
    """What stops a rebuild before it writes anything (a missing topic, a store that
    is there already)."""


class StoresExist(RebuildError):
    def __init__(self, paths: list[Path]) -> None:
        super().__init__(f"stores exist: {', '.join(str(p) for p in paths)}")
        self.paths = paths


class ReplayFailed(RebuildError):
    def __init__(self, problems: list[ReplayProblem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


def partition_count(settings: KafkaSettings, topic: str) -> int:
    """The partitions of `topic`; RebuildError when it does not exist."""
    meta = AdminClient(settings.client()).list_topics(topic, timeout=30).topics.get(topic)
    if meta is None or meta.error is not None:
        raise RebuildError(
            f"topic {topic} does not exist: is the topic prefix right (--topic-prefix, "
            "RUNSTATE_TOPIC_PREFIX)? A new cluster's topics come from `runstate topics create`"
        )
    return len(meta.partitions)


@dataclass
class PartitionRebuilt:
    """One partition's store, rebuilt: what was read and what replaying it gave."""

    partition: int
    read: int
    result: Replayed = field(repr=False)
    runs: int


class StoreRebuild:
    """The partition stores of one state directory, claimed, with a transactional
    producer for the changelog: `partition(p)` rebuilds one. Open with `rebuild_stores`."""

    def __init__(
        self,
        settings: KafkaSettings,
        topics: TopicNames,
        machines: Mapping[str, Machine],
        state: StateDir,
        producer: Producer,
        partitions: int,
        since_ms: int | None,
    ) -> None:
        self.settings, self.topics, self.machines = settings, topics, machines
        self.state, self.producer = state, producer
        self.partitions, self.since_ms = partitions, since_ms

    @property
    def root(self) -> Path:
        return self.state.root

    def _heartbeats(self, p: int, first_ms: int | None) -> list[Heartbeat]:
        return _read_heartbeats(self.settings, self.topics.heartbeats, p, first_ms)

    def _answers(
        self, p: int, first_ms: int | None, snapshots: Mapping[str, RunSnapshot]
    ) -> list[tuple[bytes, bytes, str, bytes]]:
        """The refusals the live runs remember (the rejections topic's records with a
        `content_digest`, from their run's current life), as changelog records."""
        out = []
        for rejection, raw in _read_rejections(self.settings, self.topics.rejections, p, first_ms):
            run_id, proposal_id = rejection.run_id, rejection.proposal_id
            snapshot = None if run_id is None else snapshots.get(run_id)
            if rejection.content_digest is None or snapshot is None or proposal_id is None:
                continue
            if rejection.at_ms >= snapshot.created_at_ms:
                out.append((answer_changelog_key(snapshot.run_id, proposal_id), raw, "", b""))
        return out

    def partition(self, p: int) -> PartitionRebuilt:
        """Replay partition `p`'s transitions onto its store (emptied, or as it is when
        continuing from `since_ms`), republish the snapshots of the runs that changed to
        the changelog (one transaction), then write them and the offsets to the store."""
        topics = self.topics
        path = self.state.partition(p)
        if self.since_ms is None and path.exists():
            shutil.rmtree(path)
        # Here, not at the top: `runstate get --at` and `verify` use this module in the
        # light install, which has no rocksdict (the store is the worker extra's).
        from processor.runtimes.native.store.partition import PartitionStore

        store = PartitionStore(path)
        try:
            since = self.since_ms
            start = {s.run_id: s for s in store.runs()} if since is not None else {}
            first = (
                0 if since is None else offset_for_time(self.settings, topics.transitions, p, since)
            )
            records = read_partition(self.settings, topics.transitions, p, first)
            pairs = [(Transition.model_validate_json(r.value or b""), r.offset) for r in records]
            result = apply_transitions(self.machines, pairs, start)
            changed = {t.run_id for t, _ in pairs}
            changed |= apply_heartbeats(
                self.machines, result.snapshots, self._heartbeats(p, first_ms=since)
            )
            # Each live run's history (of its current life: a run id forgotten and created
            # again starts afresh) and snapshot, as the worker writes them to the changelog.
            lives: dict[str, list[tuple[Transition, bytes]]] = {}
            for (t, _), r in zip(pairs, records, strict=True):
                life = lives.setdefault(t.run_id, [])
                if t.event == FORGET_EVENT:
                    life.clear()
                else:
                    life.append((t, r.value or b""))
            out: list[tuple[bytes, bytes, str, bytes]] = []
            for run_id in sorted(changed):
                snapshot = result.snapshots.get(run_id)
                if snapshot is None:
                    continue
                for t, raw in lives.get(run_id, []):
                    key = history_changelog_key(run_id, t.revision)
                    out.append((key, raw, REVISION_HEADER, revision_header(t)))
                out.append(
                    (
                        run_id.encode(),
                        snapshot.model_dump_json().encode(),
                        INDEX_HEADER,
                        snapshot_index(snapshot),
                    )
                )
            out += self._answers(p, since, result.snapshots)
            changelog_end = _republish(self.producer, topics.changelog, p, out)
            offsets = {} if changelog_end is None else {topics.changelog: changelog_end}
            store.restore([(key, value, header) for key, value, _, header in out], offsets)
            runs = sum(1 for key, *_ in out if not key.startswith(b"\x00"))
        finally:
            store.close()
        return PartitionRebuilt(p, len(records), result, runs)


def _read_heartbeats(
    settings: KafkaSettings, topic: str, partition: int, since_ms: int | None
) -> list[Heartbeat]:
    """The heartbeats topic's answers in `partition` (from `since_ms`): none when the
    topic does not exist (topics created before heartbeats had one)."""
    try:
        first = 0 if since_ms is None else offset_for_time(settings, topic, partition, since_ms)
        records = read_partition(settings, topic, partition, first)
    except KafkaException as exc:
        log.warning("heartbeats not read from %s[%d]: %s", topic, partition, exc)
        return []
    return [Heartbeat.model_validate_json(r.value) for r in records if r.value is not None]


def _read_rejections(
    settings: KafkaSettings, topic: str, partition: int, since_ms: int | None
) -> list[tuple[Rejection, bytes]]:
    """The rejections topic's records in `partition` (from `since_ms`), as published."""
    try:
        first = 0 if since_ms is None else offset_for_time(settings, topic, partition, since_ms)
        records = read_partition(settings, topic, partition, first)
    except KafkaException as exc:
        log.warning("rejections not read from %s[%d]: %s", topic, partition, exc)
        return []
    found = []
    for r in records:
        try:
            found.append((Rejection.model_validate_json(r.value or b""), r.value or b""))
        except ValidationError:
            continue  # not one (a record by hand): nothing to remember
    return found


@contextmanager
def rebuild_stores(
    settings: KafkaSettings,
    topics: TopicNames,
    machines: Mapping[str, Machine],
    state_dir: Path,
    group_id: str,
    *,
    since_ms: int | None = None,
    replace: bool = False,
    topic_defaults: TopicDefaults | None = None,
) -> Iterator[StoreRebuild]:
    """Claim `state_dir` (StateDirBusy if a worker holds it) for a rebuild of every
    partition: from offset 0, or onto the stores as they are from `since_ms` on.
    Creates the missing topics (the changelog, if it was deleted) as `topics create`
    would, with `topic_defaults` (replication min(3, brokers) unless given) and the
    proposals' partition count. From offset 0, stores that exist are replaced only with
    `replace` (StoresExist otherwise, before anything is written)."""
    partitions = partition_count(settings, topics.proposals)
    defaults = dataclasses.replace(topic_defaults or TopicDefaults(), partitions=partitions)
    provision_topics(AdminClient(settings.client()), topics, defaults)
    state = StateDir(state_dir, group_id, topics.proposals).claim()
    try:
        existing = [path for p in range(partitions) if (path := state.partition(p)).exists()]
        if since_ms is None and existing and not replace:
            raise StoresExist(existing)
        producer = Producer(
            settings.client({"transactional.id": f"{group_id}-replay-{os.getpid()}"})
        )
        producer.init_transactions(60)
        yield StoreRebuild(settings, topics, machines, state, producer, partitions, since_ms)
    finally:
        state.release()


def _republish(
    producer: Producer, topic: str, partition: int, records: list[tuple[bytes, bytes, str, bytes]]
) -> int | None:
    """Write (key, value, header name, header value) records to the changelog in one
    transaction (no header where its name is empty); the next offset after."""
    if not records:
        return None
    last = [-1]

    def delivered(err: object, msg: object) -> None:
        if err is None:
            last[0] = max(last[0], msg.offset())  # type: ignore[attr-defined]

    producer.begin_transaction()
    for key, value, header, header_value in records:
        producer.produce(
            topic,
            key=key,
            value=value,
            partition=partition,
            headers=[(header, header_value)] if header else None,
            on_delivery=delivered,
        )
        producer.poll(0)
    producer.commit_transaction(60)
    producer.flush(30)
    return last[0] + 1


def run_as_of(
    settings: KafkaSettings,
    topics: TopicNames,
    machines: Mapping[str, Machine],
    run_id: str,
    *,
    at_ms: int | None = None,
    at_offset: int | None = None,
) -> RunSnapshot | None:
    """Run `run_id` as it stood at `at_ms` and/or after offset `at_offset` of its
    transitions partition, replayed from that topic; None if it did not exist yet.
    ReplayFailed if a transition does not replay."""
    partition = partition_for(run_id, partition_count(settings, topics.transitions))
    pairs = []
    for record in read_partition(settings, topics.transitions, partition):
        if record.key != run_id.encode():
            continue
        if at_offset is not None and record.offset > at_offset:
            break
        transition = Transition.model_validate_json(record.value or b"")
        if at_ms is not None and transition.at_ms > at_ms:
            break
        pairs.append((transition, record.offset))
    result = apply_transitions(machines, pairs)
    if result.problems:
        raise ReplayFailed(result.problems)
    return result.snapshots.get(run_id)
