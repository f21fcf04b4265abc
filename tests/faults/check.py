"""The invariants, counted from the topics (read committed) and the workers' HTTP alone.

The oracle is the pure pipeline run again over the proposals topic: each record's
outcome as a signature (a transition by proposal id, a heartbeat's answer by proposal
id, a rejection by proposal id, run and code, a DLQ record by source partition and
offset). What the workers published
must be that multiset exactly: one missing is *lost*, one more is *duplicated* (for
the Faust runtime a byte-identical repeat is counted apart, as *repeated*, its stated
guarantee). *Mismatched* counts runs whose state disagrees anywhere: the changelog's
last snapshot against the oracle's, the worker's HTTP snapshot against a replay of the
run's transitions (and of its heartbeats since the latest), or revisions not contiguous
from 0.
"""

import hashlib
import json
import time
import urllib.error
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition

from processor.engine import Beat, Commit, Forget
from processor.engine.lint import TIMER_AUTHORITY
from processor.engine.timers import TIMER_ID_PREFIX
from processor.history.replay import Replayed, apply_heartbeats, apply_transitions
from processor.kafka.config import KafkaSettings
from processor.kafka.partitioning import partition_for
from processor.kafka.readback import read_topics
from processor.machines import builtin_machines
from processor.records.changelog_keys import is_run_key
from processor.records.pipeline import DeadLetterReason
from processor.trust.signatures import HEADER_KEY_ID
from schemas.codes import RejectionCode
from schemas.messages import DeadLetter, Heartbeat, Rejection, RunSnapshot, Transition
from tests.integration.harness import Env, WorkerProcess, decided_records

Signature = tuple[Any, ...]


@dataclass
class Row:
    scenario: str
    runtime: str
    proposals: int  # records fed to the proposals topic
    faults: int
    lost: int = 0
    duplicated: int = 0
    repeated: int = 0
    mismatched: int = 0
    crashes: int = 0
    self_restarts: int = 0  # workers that restarted themselves in place (a hung client)
    lag_zero: bool = False
    #: Counted with the workers stopped: deadline proposals their timers wrote in their
    #: last transactions, still unread (the next owner decides them; none is lost).
    pending_timers: int = 0
    recovery_s: list[float] = field(default_factory=list)
    #: Where a fault takes a broker away: per fault, from the broker answering again to
    #: the last partition's first answer (recovery_s counts from the fault itself).
    after_return_s: list[float] = field(default_factory=list)
    away_s: list[float] = field(default_factory=list)  # how long the broker was away
    seconds: float = 0.0
    examples: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """The row and its examples in full, one per line (for a failing test)."""
        figures = {k: v for k, v in vars(self).items() if k != "examples"}
        return "\n".join([str(figures), *self.examples])

    @property
    def clean(self) -> bool:
        return (
            self.lost == 0
            and self.duplicated == 0
            and self.mismatched == 0
            and self.crashes == 0
            and self.lag_zero
        )


@dataclass
class Oracle:
    signatures: Counter[Signature]
    snapshots: dict[str, RunSnapshot]
    last_offsets: dict[int, int]  # partition -> offset of its last proposals record
    #: Records at or past `upto` (not yet consumed): (a deadline the runtime signed?,
    #: partition, offset)
    pending: list[tuple[bool, int, int]] = field(default_factory=list)


def oracle(env: Env, upto: dict[int, int] | None = None) -> Oracle:
    """Every proposals record decided again by the pure pipeline, partition by partition.
    With `upto` (the group's committed offsets, read while no worker runs) a record at
    or past its partition's offset is pending, not expected: no worker has read it yet.
    Runs live in one partition, so leaving a partition's tail out changes nothing
    before it."""
    expected: Counter[Signature] = Counter()
    state: dict[str, RunSnapshot] = {}
    last: dict[int, int] = {}
    pending: list[tuple[bool, int, int]] = []
    for msg, outcome in decided_records(env):
        partition, offset = msg.partition() or 0, msg.offset() or 0
        if upto is not None and offset >= upto.get(partition, 0):
            pending.append((_runtime_deadline(env, msg, outcome), partition, offset))
            continue
        last[partition] = offset
        if isinstance(outcome, Commit):
            state[outcome.snapshot.run_id] = outcome.snapshot
            expected[("transition", outcome.transition.proposal_id)] += 1
        elif isinstance(outcome, Beat):
            state[outcome.snapshot.run_id] = outcome.snapshot
            expected[("heartbeat", outcome.heartbeat.proposal_id)] += 1
        elif isinstance(outcome, Forget):  # its last transition; the run is gone
            state.pop(outcome.transition.run_id, None)
            expected[("transition", outcome.transition.proposal_id)] += 1
        elif isinstance(outcome, DeadLetterReason):
            expected[("dlq", partition, offset)] += 1
        else:
            expected[_rejection_signature(outcome)] += 1
    return Oracle(expected, state, last, pending)


def _runtime_deadline(env: Env, msg: Message, outcome: object) -> bool:
    """A deadline proposal, signed by a key of the runtime (the workers' timers)."""
    key_id = dict(msg.headers() or []).get(HEADER_KEY_ID, b"").decode(errors="replace")
    entry = env.keyring.keys.get(key_id)
    if entry is None or entry.authority != TIMER_AUTHORITY:
        return False
    if isinstance(outcome, Commit | Forget):
        proposal_id: str | None = outcome.transition.proposal_id
    elif isinstance(outcome, Rejection) and outcome.code is not RejectionCode.UNAUTHORIZED:
        proposal_id = outcome.proposal_id  # unauthorized: a deadline's id, borrowed
    else:
        proposal_id = None
    return (proposal_id or "").startswith(TIMER_ID_PREFIX)


def _rejection_signature(rejection: Rejection) -> Signature:
    return ("rejection", rejection.proposal_id, rejection.run_id, rejection.code.value)


@dataclass
class Outputs:
    """What the workers published, kept small: a soak publishes millions of records,
    and decoded they took more memory than the machine has. Records are kept as read
    (decoded again when replayed), and each signature's records as digests."""

    signatures: Counter[Signature]
    #: A digest of each signature's first record, and of any more (compared for repeats).
    first: dict[Signature, bytes]
    again: dict[Signature, list[bytes]]
    transitions: list[bytes]  # in read order (each run's in its order)
    revisions: dict[str, list[int]]  # per run, the revisions of its transitions
    snapshots: dict[str, bytes]  # per run, the changelog's last snapshot
    heartbeats: list[bytes] = field(default_factory=list)

    def snapshot(self, run_id: str) -> RunSnapshot | None:
        raw = self.snapshots.get(run_id)
        return None if raw is None else RunSnapshot.model_validate_json(raw)

    def replayed(self) -> Replayed:
        """The runs as their transitions and, since the latest, their heartbeats say."""
        machines = builtin_machines()
        result = apply_transitions(
            machines, ((Transition.model_validate_json(v), None) for v in self.transitions)
        )
        beats = (Heartbeat.model_validate_json(v) for v in self.heartbeats)
        apply_heartbeats(machines, result.snapshots, beats)
        return result

    def extras(self, expected: Counter[Signature]) -> tuple[int, int]:
        """Outcomes beyond the oracle's: (repeated byte for byte, different)."""
        repeated = different = 0
        for sig, n in (self.signatures - expected).items():
            digests = [self.first[sig], *self.again.get(sig, [])]
            copies = len(digests) - len(set(digests))
            repeated += min(n, copies)
            different += n - min(n, copies)
        return repeated, different


def outputs(env: Env) -> Outputs:
    t = env.topics
    got = Outputs(Counter(), {}, defaultdict(list), [], defaultdict(list), {})
    topics = [t.transitions, t.rejections, t.dlq, t.changelog, t.heartbeats]
    for msg in read_topics(KafkaSettings(env.bootstrap), topics):
        topic, value = msg.topic(), msg.value()
        if topic == t.changelog:
            if value is not None and is_run_key(msg.key()):
                got.snapshots[msg.key().decode()] = value
            continue
        sig: Signature
        if topic == t.transitions:
            transition = Transition.model_validate_json(value)
            got.transitions.append(value)
            got.revisions[transition.run_id].append(transition.revision)
            sig = ("transition", transition.proposal_id)
        elif topic == t.heartbeats:
            got.heartbeats.append(value)
            sig = ("heartbeat", Heartbeat.model_validate_json(value).proposal_id)
        elif topic == t.rejections:
            sig = _rejection_signature(Rejection.model_validate_json(value))
        else:
            letter = DeadLetter.model_validate_json(value)
            sig = ("dlq", letter.partition, letter.offset)
        got.signatures[sig] += 1
        digest = hashlib.blake2b(_normal(sig, value), digest_size=16).digest()
        if sig in got.first:
            got.again[sig].append(digest)
        else:
            got.first[sig] = digest
    return got


def _normal(sig: Signature, value: bytes) -> bytes:
    """A record as compared for repeats (a DLQ record without the time it was written)."""
    if sig[0] != "dlq":
        return value
    return (
        DeadLetter.model_validate_json(value)
        .model_copy(update={"at_ms": 0})
        .model_dump_json()
        .encode()
    )


def lag_returns_to_zero(env: Env, last_offsets: dict[int, int], timeout: float = 60.0) -> bool:
    """The group's committed offsets pass the last record of every proposals partition
    (the log end can be one further: a transaction's commit marker)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        committed = committed_offsets(env)
        if all(committed.get(p, -1) > last for p, last in last_offsets.items()):
            return True
        time.sleep(1.0)
    return False


def committed_offsets(env: Env) -> dict[int, int]:
    """The group's committed offset of each proposals partition (-1001 where none)."""
    consumer = Consumer(
        {"bootstrap.servers": env.bootstrap, "group.id": env.group_id, "log_level": 3}
    )
    try:
        meta = consumer.list_topics(env.topics.proposals, timeout=30)
        parts = [
            TopicPartition(env.topics.proposals, p)
            for p in meta.topics[env.topics.proposals].partitions
        ]
        return {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=30)}
    finally:
        consumer.close()


def http_snapshots(
    workers: list[WorkerProcess], run_ids: list[str], partitions: int
) -> dict[str, Any]:
    """Each run's snapshot from the worker that owns its partition (None if unknown)."""
    owners: dict[int, WorkerProcess | None] = {}
    for worker in workers:
        health = worker.health()
        for p in (health or {}).get("partitions", []):
            owners[p] = worker if p not in owners else None  # two claim it: ask again
    out: dict[str, Any] = {}
    for run_id in run_ids:
        worker = owners.get(partition_for(run_id, partitions))
        if worker is None:
            out[run_id] = "no owner"
            continue
        try:
            data = worker.get(worker.run_path(run_id))
        except (urllib.error.URLError, OSError) as exc:
            data = f"unreachable: {exc}"
        out[run_id] = (
            data
            if not isinstance(data, dict)
            else RunSnapshot.model_validate_json(json.dumps(data))
        )
    return out


def check(
    row: Row,
    env: Env,
    workers: list[WorkerProcess],
    partitions: int = 3,
    settle: float = 240.0,
) -> Row:
    """Fill `row` with the invariants, once the outputs have caught up (or `settle` s).
    Without `workers` (all stopped, as the soak does before counting: at its size a
    read of the topics takes minutes, and running workers' deadlines keep changing
    them meanwhile) nothing is asked over HTTP, and nothing new can arrive; the records
    past the group's committed offsets are then pending, not expected: the deadline
    proposals the workers' timers wrote in their last transactions are read by the next
    owner, and any other proposal left unread means the lag did not return to zero."""
    upto = None if workers else committed_offsets(env)
    # The workers' own deadline proposals keep arriving for a while after the workload:
    # decide both sides again until they agree or `settle` seconds have passed.
    deadline = time.monotonic() + settle
    while True:
        got = outputs(env)  # first: every outcome read has its proposal in the oracle's read
        truth = oracle(env, upto)
        expected, state = truth.signatures, truth.snapshots
        missing = expected - got.signatures
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(2.0)
    row.lost = sum(missing.values())
    extra = got.signatures - expected  # for the examples
    row.repeated, row.duplicated = got.extras(expected)
    row.examples += [f"lost {s}" for s in list(missing)[:3]] + [
        f"extra {s}" for s in list(extra)[:3]
    ]
    # state: changelog = oracle; HTTP = replay of transitions; revisions contiguous
    bad: set[str] = set()
    for run_id in set(state) | set(got.snapshots):
        if state.get(run_id) != got.snapshot(run_id):
            bad.add(run_id)
    for run_id, revs in got.revisions.items():
        distinct = sorted(set(revs))
        if distinct != list(range(len(distinct))):
            bad.add(run_id)
    replayed = got.replayed()
    bad |= {p.transition_id.rsplit(":", 1)[0] for p in replayed.problems}
    # Asked again while any differ (for 60 s), with the transitions read again too:
    # the workers' own deadlines may commit after the read above, and after a fault the
    # group may still be moving partitions (a worker answers only for its own).
    differ = sorted(replayed.snapshots) if workers else []
    until = time.monotonic() + 60
    while differ:
        served = http_snapshots(workers, differ, partitions)
        differ = [r for r, snap in served.items() if snap != replayed.snapshots.get(r)]
        if not differ or time.monotonic() > until:
            break
        time.sleep(1.0)
        replayed = outputs(env).replayed()
    for run_id in differ:
        bad.add(run_id)
        if len(row.examples) < 8:
            row.examples.append(f"{run_id}: HTTP {str(served[run_id])[:80]}")
    row.mismatched = len(bad)
    if upto is None:
        row.lag_zero = lag_returns_to_zero(env, truth.last_offsets)
    else:
        others = [f"{p}:{o}" for deadline, p, o in truth.pending if not deadline]
        row.pending_timers = len(truth.pending) - len(others)
        row.lag_zero = not others
        row.examples += [f"unread proposal at {where}" for where in others[:3]]
    return row
