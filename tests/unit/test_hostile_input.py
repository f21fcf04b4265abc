"""Every kind of hostile record ends as the outcome it must: a DLQ record, a rejection
with its code, or (hostile-looking but valid input) a commit, never an exception (the
pure pipeline, no broker)."""

from collections import Counter

from processor.engine import Commit
from processor.machines import builtin_machines
from processor.records.pipeline import DeadLetterReason, decide_record
from processor.trust.keygen import generate_keyring
from schemas.messages import Rejection
from tests.faults.hostile import COMMIT, DLQ, WELL_FORMED, RawRecord, hostile_records

NOW = 1_800_000_000_000


def test_each_hostile_kind_ends_as_its_outcome() -> None:
    keyring = generate_keyring()
    machines = builtin_machines()
    run = decide_record(
        b"r1",
        b'{"run_id": "r1", "proposal_id": "c", "event": "create", "payload": {"machine": "run_state"}}',
        None,
        NOW,
        topic="runstate.proposals",
        keyring=keyring,
        machines=machines,
        lookup=lambda _: None,
        seen=lambda _run, _proposal: None,
        placement=None,
    )
    assert isinstance(run, Rejection)  # unsigned: proves nothing is decided before auth
    good = [RawRecord(b"r1", b'{"run_id": "r1", "event": "start"}', [])]
    records = hostile_records(["r1"], good, 1_000, keyring, "runstate.proposals", signed_at_ms=NOW)
    kinds: Counter[str] = Counter()
    for record in records:
        outcome = decide_record(
            record.key,
            record.value,
            record.headers,
            NOW,
            topic="runstate.proposals",
            keyring=keyring,
            machines=machines,
            lookup=lambda _: None,
            seen=lambda _run, _proposal: None,
            placement=None,
        )
        kinds[record.kind] += 1
        if record.expect is None:
            continue
        if record.expect == DLQ:
            assert isinstance(outcome, DeadLetterReason), (record.kind, outcome)
        elif record.expect == COMMIT:
            assert isinstance(outcome, Commit), (record.kind, outcome)
        elif record.expect == WELL_FORMED:
            assert not isinstance(outcome, Commit | DeadLetterReason), (record.kind, outcome)
            # on a run that does not exist: refused unknown_run, after the schema passed
            assert outcome.code.value == "unknown_run", (record.kind, outcome.code, outcome.detail)
        else:
            assert not isinstance(outcome, Commit | DeadLetterReason), (record.kind, outcome)
            assert outcome.code.value == record.expect or (
                # on a run that does not exist, a well-formed signed proposal is refused
                # unknown_run before its event or revision is looked at
                outcome.code.value == "unknown_run"
                and record.kind in ("unknown event", "absurd revision")
            ), (record.kind, outcome.code, outcome.detail)
    new_kinds = (
        {
            f"{what} in {field}, {signing}"
            for what in ("lone surrogate", "control character", "over-long id")
            for field in ("run_id", "proposal_id")
            for signing in ("signed", "unsigned")
        }
        | {
            f"lone surrogate (raw bytes) in {field}, {signing}"
            for field in ("run_id", "proposal_id")
            for signing in ("signed", "unsigned")
        }
        | {
            f"lone surrogate in {where}, {signing}"
            for where in ("payload", "metadata")
            for signing in ("signed", "unsigned")
        }
        | {
            f"key is the run id with invalid UTF-8 {how}"
            for how in ("appended", "inserted", "replacing a byte")
        }
        | {
            "huge key, signed proposal",
            "huge key, not a proposal",
            "large value, random bytes",
            "large value, JSON array",
            "large value, proposal cut short",
            "arbitrary Unicode in a create",
            "ids at their byte limits",
            "arbitrary Unicode in a step",
            "step result nested too deeply",
            "metadata nested too deeply",
            "metadata.timer of any type",
            "a deadline's proposal id on a create",
        }
    )
    assert new_kinds <= set(kinds), sorted(new_kinds - set(kinds))
    assert len(kinds) >= 17 + len(new_kinds)
