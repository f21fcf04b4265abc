"""`runstate verify`: the transitions topic is what the proposals topic implies.

Per partition, the proposals are decided again from offset 0 with the same pure
pipeline the worker runs; the commits that come out must equal the transitions topic
record by record. Independently, every transition's hash is recomputed and every
run's chain of `prev_hash` links checked. Any difference is reported with its offset.
"""

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from processor.engine import Commit, Forget, Machine
from processor.engine.continuation import CONTINUED_BY, UNDONE, not_continuable
from processor.engine.lint import FORGET_EVENT, MIGRATE_EVENT
from processor.engine.machine import machine_for, with_current
from processor.history.replay import apply_transitions
from processor.history.resume import continuation_problems
from processor.records.intake import (
    DEFAULT_MAX_PROPOSAL_BYTES,
    Headers,
    TimestampType,
    Unproven,
    authenticate,
    header_value,
)
from processor.records.outputs import CommitLimits
from processor.records.pipeline import (
    DEFAULT_MAX_STATE_BYTES,
    DeadLetterReason,
    Outcome,
    Placement,
    RunsInMemory,
    decide_record,
)
from processor.trust.keyring import Keyring
from processor.trust.signatures import HEADER_KEY_ID
from schemas.audit import transition_hash
from schemas.messages import Transition

log = logging.getLogger("runstate.verify")


@dataclass(frozen=True)
class Record:
    """A record as read back from a topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int
    timestamp_type: TimestampType = TimestampType.LOG_APPEND_TIME


@dataclass(frozen=True)
class Finding:
    partition: int
    offset: int | None
    detail: str
    topic: str = "transitions"  # or "machines": a machine version that takes no effect

    def __str__(self) -> str:
        where = f"offset {self.offset}" if self.offset is not None else "end of partition"
        return f"{self.topic} partition {self.partition}, {where}: {self.detail}"


def _differences(expected: Transition, found: Transition) -> str:
    fields = [
        name
        for name in type(expected).model_fields
        if getattr(expected, name) != getattr(found, name)
    ]
    return ", ".join(fields)


def verify_partition(
    partition: int,
    proposals: Sequence[Record],
    transitions: Sequence[Record],
    *,
    topic: str,
    machines: Mapping[str, Machine],
    keyring: Keyring,
    partitions: int | None = None,
    max_bytes: int = DEFAULT_MAX_PROPOSAL_BYTES,
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    commit_limits: CommitLimits | None = None,
) -> list[Finding]:
    findings: list[Finding] = []
    runs = RunsInMemory()
    expected: list[Transition] = []
    created = _created_with(transitions)
    creations: dict[bytes, int] = {}  # run key -> its creations decided so far
    for record in proposals:
        key = record.key or b""
        versions = created.get(key, [])
        made = creations.get(key, 0)
        pinned = versions[min(made, len(versions) - 1)] if versions else None
        try:
            outcome: Outcome = decide_record(
                record.key,
                record.value,
                record.headers,
                record.timestamp_ms,
                topic=topic,
                keyring=keyring,
                machines=machines if pinned is None else with_current(machines, *pinned),
                lookup=runs.lookup,
                seen=runs.seen,
                placement=None if partitions is None else Placement(partition, partitions),
                max_bytes=max_bytes,
                max_state_bytes=max_state_bytes,
                timestamp_type=record.timestamp_type,
                commit_limits=commit_limits,
            )
        except Exception as exc:  # as the workers do: set aside, and the rest is checked
            log.exception(
                "proposals partition %d, offset %d: deciding it failed", partition, record.offset
            )
            outcome = DeadLetterReason(f"internal error while deciding: {exc!r}")
        runs.apply(outcome)
        if isinstance(outcome, Commit | Forget):  # a forget is a transition too
            expected.append(outcome.transition)
            if outcome.transition.revision == 0:
                creations[key] = made + 1

    last_hash: dict[str, str] = {}
    for index, record in enumerate(transitions):
        try:
            found = Transition.model_validate_json(record.value or b"")
        except ValidationError as exc:
            findings.append(
                Finding(partition, record.offset, f"not a transition: {exc.errors()[0]['msg']}")
            )
            continue
        if index >= len(expected):
            findings.append(
                Finding(partition, record.offset, f"{found.transition_id} follows from no proposal")
            )
        elif found != expected[index]:
            findings.append(
                Finding(
                    partition,
                    record.offset,
                    f"{found.transition_id} differs from the replay of the proposals in: "
                    f"{_differences(expected[index], found)}",
                )
            )
        try:
            intact = transition_hash(found.__dict__) == found.hash
            why = "hash does not match its content"
        except ValueError as exc:  # a number RFC 8785 has no form for: no hash at all
            intact, why = False, f"hash cannot be computed: {exc}"
        if not intact:
            findings.append(Finding(partition, record.offset, f"{found.transition_id}: {why}"))
        if found.prev_hash != last_hash.get(found.run_id, ""):
            findings.append(
                Finding(
                    partition,
                    record.offset,
                    f"{found.transition_id}: prev_hash breaks the run's chain",
                )
            )
        if found.event == FORGET_EVENT:  # the run is gone: its id may begin a new chain
            last_hash.pop(found.run_id, None)
        else:
            last_hash[found.run_id] = found.hash
    for missing in expected[len(transitions) :]:
        findings.append(
            Finding(
                partition, None, f"{missing.transition_id} is implied by the proposals but missing"
            )
        )
    return findings


def _created_with(transitions: Sequence[Record]) -> dict[bytes, list[tuple[str, str | None]]]:
    """Run key -> (machine, version) each of its creations got, in order (a run id is
    created again once its run is forgotten). Which version new runs get changes with
    deploys, which the proposals do not record: each creation is decided again by the
    version its transition names (that version must be held here)."""
    found: dict[bytes, list[tuple[str, str | None]]] = {}
    for record in transitions:
        if record.value is not None and b'"revision":0,' in record.value:
            try:
                t = Transition.model_validate_json(record.value)
            except ValidationError:
                continue
            if t.revision == 0:
                found.setdefault(t.run_id.encode(), []).append((t.machine, t.machine_version))
    return found


def verify_runs_across_partitions(transitions: Mapping[int, Sequence[Record]]) -> list[Finding]:
    """A run lives in one partition, with one chain from one creation: a run id whose
    transitions are in two partitions (a producer that partitioned by another hash, a
    key that was not the run id) has two chains, and its second is reported broken."""
    home: dict[str, tuple[int, int]] = {}  # run id -> (partition, offset) of its first
    findings: list[Finding] = []
    reported: set[tuple[str, int]] = set()
    for partition in sorted(transitions):
        for record in transitions[partition]:
            try:
                found = Transition.model_validate_json(record.value or b"")
            except ValidationError:
                continue  # reported by verify_partition
            first = home.setdefault(found.run_id, (partition, record.offset))
            if first[0] != partition and (found.run_id, partition) not in reported:
                reported.add((found.run_id, partition))
                findings.append(
                    Finding(
                        partition,
                        record.offset,
                        f"run '{found.run_id}' has a second chain here: it also has "
                        f"transitions in partition {first[0]} (from offset {first[1]}); a "
                        "run's proposals must all be keyed by its run id (murmur2)",
                    )
                )
    return findings


def verify_migrations(
    partition: int,
    proposals: Sequence[Record],
    transitions: Sequence[Record],
    *,
    topic: str,
    keyring: Keyring,
) -> list[Finding]:
    """Every committed `migrate` must come from an operator's key: the key that signed
    its proposal (found by proposal id in the same partition) is named otherwise."""
    migrations: list[tuple[Record, Transition]] = []
    for record in transitions:
        if record.value is not None and b'"migrate"' in record.value:
            try:
                found = Transition.model_validate_json(record.value)
            except ValidationError:
                continue  # reported by verify_partition
            if found.event == MIGRATE_EVENT:
                migrations.append((record, found))
    if not migrations:
        return []
    wanted = {t.proposal_id for _, t in migrations}
    signed: dict[str, Record] = {}
    for record in proposals:
        if record.value is None or b'"migrate"' not in record.value:
            continue
        try:
            proposal_id = json.loads(record.value).get("proposal_id")
        except (ValueError, AttributeError):
            continue
        if proposal_id in wanted:
            signed.setdefault(proposal_id, record)
    findings = []
    for record, transition in migrations:
        why = _not_an_operators_migration(signed.get(transition.proposal_id), topic, keyring)
        if why is not None:
            findings.append(
                Finding(
                    partition,
                    record.offset,
                    f"{transition.transition_id} migrates run '{transition.run_id}' to "
                    f"version {transition.machine_version} by {transition.principal.authority} "
                    f"({transition.principal.source}): {why}; only an operator's key migrates",
                )
            )
    return findings


def _not_an_operators_migration(record: Record | None, topic: str, keyring: Keyring) -> str | None:
    if record is None:
        return "no proposal of this partition proposed it"
    credential = authenticate(
        topic, record.key, record.value or b"", record.headers, keyring, record.timestamp_ms
    )
    if isinstance(credential, Unproven):
        return f"its proposal (offset {record.offset}) proves no key: {credential.why}"
    if credential.scope is None or not credential.scope.operator:
        raw = header_value(record.headers, HEADER_KEY_ID)
        key_id = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        return f"its proposal (offset {record.offset}) is signed by key '{key_id}', no operator's"
    return None


def verify_continuations(
    transitions: Mapping[int, Sequence[Record]], machines: Mapping[str, Machine]
) -> list[Finding]:
    """A run that continues another (`create` with `continues`) must carry exactly what
    that run had at the revision it names (its succeeded and executing steps, its
    checkpoint), continue a run that finished other than by an approver, and be named by it (its
    `continued_by` transition): what the original checked when it took the
    continuation (processor/engine/continuation.py), proven again from the log. And a
    run that names a continuation it did not undo is continued by that run."""
    chains: dict[str, list[tuple[int, int, Transition]]] = {}
    for partition in sorted(transitions):
        for record in transitions[partition]:
            try:
                found = Transition.model_validate_json(record.value or b"")
            except ValidationError:
                continue  # reported by verify_partition
            chains.setdefault(found.run_id, []).append((partition, record.offset, found))
    findings: list[Finding] = []
    for chain in chains.values():
        for partition, offset, created in chain:
            continues = created.payload.get("continues") if created.event == "create" else None
            if not isinstance(continues, dict):
                continue
            why = _continuation_refuted(created, continues, chains, machines)
            if why:
                findings.append(Finding(partition, offset, f"{created.transition_id}: {why}"))
        # The other way: a run that names a continuation (and did not undo it) is the one
        # that continuation continues.
        named = [(p, o, t) for p, o, t in chain if t.event in (CONTINUED_BY, UNDONE)]
        if named and named[-1][2].event == CONTINUED_BY:
            partition, offset, last = named[-1]
            continuation = str(last.payload.get("run_id"))
            creates = [
                t.payload.get("continues")
                for _, _, t in chains.get(continuation, [])
                if t.event == "create"
            ]
            if not any(isinstance(c, dict) and c.get("run_id") == last.run_id for c in creates):
                findings.append(
                    Finding(
                        partition,
                        offset,
                        f"{last.transition_id}: names run '{continuation}' as its "
                        "continuation, which does not continue it",
                    )
                )
    return findings


def _continuation_refuted(
    created: Transition,
    continues: Mapping[str, object],
    chains: Mapping[str, list[tuple[int, int, Transition]]],
    machines: Mapping[str, Machine],
) -> str | None:
    original = str(continues.get("run_id"))
    revision = continues.get("revision")
    before = [
        t
        for _, _, t in chains.get(original, [])
        if isinstance(revision, int) and t.revision <= revision
    ]
    if not before or before[-1].revision != revision:
        return f"continues run '{original}' at revision {revision}, which the log does not hold"
    replayed = apply_transitions(machines, [(t, None) for t in before])
    snapshot = replayed.snapshots.get(original)
    if snapshot is None or replayed.problems:
        return f"continues run '{original}', whose transitions do not replay"
    last = before[-1]
    machine = machine_for(machines, last.machine, last.machine_version)
    if machine is None:
        return f"continues run '{original}', whose machine version is not held"
    why = not_continuable(machine, snapshot)
    if why is not None:
        return f"continues run '{original}': {why}"
    problems = continuation_problems(created, snapshot)
    named = any(
        t.event == CONTINUED_BY and t.payload.get("run_id") == created.run_id
        for _, _, t in chains.get(original, [])
        if t.revision > revision
    )
    if not named:
        problems.append(f"run '{original}' does not name it (no '{CONTINUED_BY}' transition)")
    return "; ".join(problems) if problems else None
