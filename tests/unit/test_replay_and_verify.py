"""Replay from transitions and verification against proposals, without a broker."""

from dataclasses import replace
from typing import Any

import pytest

from processor.engine import Commit, Forget
from processor.engine.machine import Catalog
from processor.engine.parse import parse_machine
from processor.history.audit import (
    Finding,
    Record,
    verify_partition,
    verify_runs_across_partitions,
)
from processor.history.replay import apply_transitions
from processor.history.verify import verify_topics
from processor.history.versions import RefusedVersion
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines, builtin_source
from processor.records.intake import DEFAULT_MAX_PROPOSAL_BYTES, Headers
from processor.records.pipeline import DEFAULT_MAX_STATE_BYTES, RunsInMemory, decide_record
from processor.records.punctuator import Punctuator
from processor.trust.keygen import generate_keyring
from processor.trust.keyring import Keyring, signing_key_from
from schemas import Proposal, Transition
from schemas.audit import transition_hash
from tests.unit.driver import APPROVER, Driver

MACHINES = builtin_machines()


def _lifecycle() -> Driver:
    run = Driver(run_id="v1")
    run.create("task_lifecycle", max_retries=2)
    run.commit("start")
    run.commit("step_started", payload={"step": "s", "idempotency_key": "k"})
    run.commit("step_succeeded", payload={"step": "s", "result": {"ok": 1}})
    run.commit("pause_for_approval")
    run.commit("approval_granted", APPROVER, payload=run.decision())
    run.commit("transient_error")
    run.commit("retry")
    run.commit("complete")
    return run


def test_replaying_transitions_rebuilds_the_snapshot() -> None:
    run = _lifecycle()
    result = apply_transitions(MACHINES, [(t, i) for i, t in enumerate(run.history)])
    assert result.problems == [] and result.applied == len(run.history)
    assert result.snapshots["v1"] == run.snapshot


def test_replay_from_a_midpoint_skips_what_the_store_has() -> None:
    run = _lifecycle()
    half = apply_transitions(MACHINES, [(t, i) for i, t in enumerate(run.history[:4])])
    rest = apply_transitions(
        MACHINES, [(t, i) for i, t in enumerate(run.history[2:])], start=half.snapshots
    )
    assert rest.skipped == 2 and rest.problems == []
    assert rest.snapshots["v1"] == run.snapshot


def test_replay_names_gaps_and_altered_transitions() -> None:
    run = _lifecycle()
    gap = apply_transitions(MACHINES, [(run.history[0], 0), (run.history[2], 2)])
    assert "does not follow" in str(gap.problems[0]) and "offset 2" in str(gap.problems[0])
    altered = run.history[1].model_copy(update={"to_state": "done"})
    bad = apply_transitions(MACHINES, [(run.history[0], 0), (altered, 1)])
    assert "different transition" in bad.problems[0].detail
    forged = run.history[1].model_copy(update={"event": "complete"})
    refused = apply_transitions(MACHINES, [(run.history[0], 0), (forged, 1)])
    assert "refuses it: invalid_transition" in refused.problems[0].detail


TOPIC = "runstate.proposals"


def _records() -> tuple[Keyring, list[Record], list[Record]]:
    """Signed proposal records and the transition records the worker would publish."""
    keyring = generate_keyring()
    events = [
        ("create", "runtime", {"machine": "owned_run"}),
        ("run_started", "runtime", {}),
        ("run_completed", "model", {}),  # refused: no transition
        ("tool_result", "tool", {"fact": "build=green"}),
        ("run_completed", "runtime", {}),
    ]
    proposals = []
    for offset, (event, key, payload) in enumerate(events):
        value = Proposal(proposal_id=f"p{offset}", run_id="r", event=event, payload=payload)
        raw = value.model_dump_json(exclude_none=True).encode()
        headers = signing_key_from(keyring, key).headers(TOPIC, b"r", raw, 1000 + offset)
        proposals.append(Record(0, offset, b"r", raw, headers, 1000 + offset))
    runs = RunsInMemory()
    transitions = []
    for rec in proposals:
        outcome = decide_record(
            rec.key,
            rec.value,
            rec.headers,
            rec.timestamp_ms,
            topic=TOPIC,
            keyring=keyring,
            machines=MACHINES,
            lookup=runs.lookup,
            seen=runs.seen,
            placement=None,
        )
        runs.apply(outcome)
        if isinstance(outcome, Commit):
            raw = outcome.transition.model_dump_json().encode()
            # offsets leave gaps, as transaction markers do
            transitions.append(Record(0, len(transitions) * 2, b"r", raw, None, 0))
    return keyring, proposals, transitions


def test_verify_passes_on_a_clean_history_and_names_the_altered_offset() -> None:
    keyring, proposals, transitions = _records()
    assert (
        verify_partition(0, proposals, transitions, topic=TOPIC, machines=MACHINES, keyring=keyring)
        == []
    )

    altered = Transition.model_validate_json(transitions[2].value or b"")
    tampered = altered.model_copy(update={"to_state": "cancelled"}).model_dump_json().encode()
    edited = [
        *transitions[:2],
        Record(0, transitions[2].offset, b"r", tampered, None, 0),
        *transitions[3:],
    ]
    findings = verify_partition(
        0, proposals, edited, topic=TOPIC, machines=MACHINES, keyring=keyring
    )
    assert findings and all(f.offset == transitions[2].offset for f in findings)
    assert "differs from the replay of the proposals in: to_state" in str(findings[0])
    assert any("hash does not match" in f.detail for f in findings)

    garbage = [*transitions[:1], Record(0, 7, b"r", b"{nope", None, 0)]
    found = verify_partition(0, proposals, garbage, topic=TOPIC, machines=MACHINES, keyring=keyring)
    assert "offset 7: not a transition" in str(found[0])
    assert any("missing" in f.detail and f.offset is None for f in found)
    extra = verify_partition(
        0, proposals[:2], transitions, topic=TOPIC, machines=MACHINES, keyring=keyring
    )
    assert any("follows from no proposal" in f.detail for f in extra)


def test_verify_reports_a_number_no_hash_can_be_computed_over() -> None:
    # A record edited to hold what RFC 8785 has no form for (the worker never commits
    # one: proposals with such numbers are refused) is a finding, not a crash.
    keyring, proposals, transitions = _records()
    altered = Transition.model_validate_json(transitions[2].value or b"")
    for number in (b"9007199254740992", b"-1" + b"0" * 30, b"1e400"):
        tampered = altered.model_copy(update={"metadata": {"n": "N"}}).model_dump_json()
        raw = tampered.encode().replace(b'"n":"N"', b'"n":' + number)
        edited = [*transitions[:2], Record(0, transitions[2].offset, b"r", raw, None, 0)]
        findings = verify_partition(
            0, proposals[:4], edited, topic=TOPIC, machines=MACHINES, keyring=keyring
        )
        assert any("hash cannot be computed" in f.detail for f in findings), findings


def test_verify_reports_a_run_with_chains_in_two_partitions() -> None:
    # Each partition's chain is intact on its own; the run has two creations between them
    # (a producer that partitioned by another hash, or a key that was not the run id).
    keyring, proposals, transitions = _records()
    assert verify_runs_across_partitions({0: transitions}) == []
    moved = [Record(2, r.offset, r.key, r.value, None, 0) for r in transitions[:2]]
    assert (
        verify_partition(2, proposals[:2], moved, topic=TOPIC, machines=MACHINES, keyring=keyring)
        == []
    )
    findings = verify_runs_across_partitions({0: transitions, 2: moved})
    assert len(findings) == 1 and findings[0].partition == 2
    assert "second chain" in findings[0].detail and "partition 0" in findings[0].detail


def test_verify_follows_a_run_forgotten_and_created_again() -> None:
    """Verify counts a retention `forget` as the transition it is, starts the run id's
    chain again after it, and decides each creation of a run id by that creation's own
    machine version: a run forgotten, then created again under a newer version, checks
    clean; a break in the new chain is still found."""
    source = builtin_source("run_state").replace("name: run_state", "name: short")
    v1 = parse_machine(source + "\nretention_ms: 5000\n", "short.yaml")
    v2 = parse_machine(source + "\nretention_ms: 6000\n", "short.yaml")
    assert v1.version != v2.version
    keyring = generate_keyring()
    runtime = signing_key_from(keyring, "runtime")
    punctuator = Punctuator(TopicNames.with_prefix(), runtime)
    runs = RunsInMemory()
    proposals: list[Record] = []
    transitions: list[Record] = []

    def send(machines: Catalog, value: bytes, headers: Headers, at_ms: int) -> object:
        proposals.append(Record(0, len(proposals), b"r", value, headers, at_ms))
        outcome = decide_record(
            b"r", value, headers, at_ms, topic=TOPIC, keyring=keyring, machines=machines,
            lookup=runs.lookup, seen=runs.seen, placement=None,
        )  # fmt: skip
        runs.apply(outcome)
        if isinstance(outcome, Commit | Forget):
            raw = outcome.transition.model_dump_json().encode()
            transitions.append(Record(0, len(transitions), b"r", raw, None, at_ms))
        return outcome

    def propose(machines: Catalog, event: str, pid: str, at_ms: int, **fields: object) -> object:
        proposal = Proposal(proposal_id=pid, run_id="r", event=event, **fields)  # type: ignore[arg-type]
        value = proposal.model_dump_json(exclude_none=True).encode()
        return send(machines, value, runtime.headers(TOPIC, b"r", value, at_ms), at_ms)

    first, second = Catalog([*MACHINES.values(), v1]), Catalog([*MACHINES.values(), v2], [v1])
    assert isinstance(propose(first, "create", "c1", 1_000, payload={"machine": "short"}), Commit)
    propose(first, "start", "s1", 1_001)
    propose(first, "complete", "d1", 1_002)
    snapshot = runs.lookup("r")
    assert snapshot is not None
    timer = next(t for t in snapshot.timers if t.name == "retention")
    record = punctuator.deadline(snapshot, timer, timer.due_at_ms + 1)
    assert record.headers is not None
    forgot = send(second, record.value, record.headers, timer.due_at_ms + 1)
    assert isinstance(forgot, Forget)
    again = propose(second, "create", "c2", timer.due_at_ms + 10, payload={"machine": "short"})
    assert isinstance(again, Commit) and again.transition.machine_version == v2.version
    propose(second, "start", "s2", timer.due_at_ms + 11)

    def verify(found: list[Record]) -> list[str]:
        return [
            str(f)
            for f in verify_partition(0, proposals, found, topic=TOPIC, machines=second, keyring=keyring)
        ]  # fmt: skip

    assert verify(transitions) == []
    last = Transition.model_validate_json(transitions[-1].value or b"")
    broken = last.model_copy(update={"prev_hash": "0" * 64})
    broken = broken.model_copy(update={"hash": transition_hash(broken.__dict__)})
    edited = [*transitions[:-1], Record(0, transitions[-1].offset, b"r", broken.model_dump_json().encode(), None, 0)]  # fmt: skip
    assert any("prev_hash breaks the run's chain" in f for f in verify(edited))


def test_verify_sets_aside_a_proposal_it_cannot_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the workers do (the DLQ, with the reason): a proposal whose deciding raises (a
    bug; for example metadata {"timer": []}) does not abort verify; the rest is checked."""
    import processor.history.audit as audit

    keyring, proposals, transitions = _records()
    real = audit.decide_record

    def flaky(key: bytes | None, value: bytes | None, *args: Any, **kw: Any) -> Any:
        if value == proposals[2].value:  # the refused one: it committed nothing
            raise TypeError("unhashable type: 'list'")
        return real(key, value, *args, **kw)

    monkeypatch.setattr(audit, "decide_record", flaky)
    found = verify_partition(
        0, proposals, transitions, topic=TOPIC, machines=MACHINES, keyring=keyring
    )
    assert found == []


def test_verifying_the_topics_counts_what_it_checked_and_puts_refused_versions_first() -> None:
    keyring, proposals, transitions = _records()
    done: list[int] = []
    kept = verify_topics(
        {0: proposals},
        {0: transitions},
        partitions=1,
        topic=TOPIC,
        machines=MACHINES,
        keyring=keyring,
        max_bytes=DEFAULT_MAX_PROPOSAL_BYTES,
        max_state_bytes=DEFAULT_MAX_STATE_BYTES,
        on_partition=done.append,
    )
    assert kept.findings == [] and done == [0]
    assert (kept.partitions, kept.transitions, kept.proposals) == (1, len(transitions), 5)

    altered = Transition.model_validate_json(transitions[1].value or b"")
    raw = altered.model_copy(update={"to_state": "done"}).model_dump_json().encode()
    forged = [*transitions[:1], replace(transitions[1], value=raw), *transitions[2:]]
    refused = RefusedVersion(0, 7, b"m@2", b"{}", 0, "not signed")
    found = verify_topics(
        {0: proposals},
        {0: forged},
        partitions=1,
        topic=TOPIC,
        machines=MACHINES,
        keyring=keyring,
        max_bytes=DEFAULT_MAX_PROPOSAL_BYTES,
        max_state_bytes=DEFAULT_MAX_STATE_BYTES,
        refused=[refused],
    )
    assert found.findings[0] == Finding(0, 7, str(refused), "machines")
    assert any(f.offset == transitions[1].offset for f in found.findings[1:])
