"""Every kind of hostile record ends as the outcome it must: a DLQ record or a
rejection with its code, never an exception (the pure pipeline, no broker)."""

from collections import Counter

from processor.engine import Commit
from processor.keyring import generate_keyring
from processor.machines import builtin_machines
from processor.pipeline import DeadLetterReason, decide_record
from schemas.messages import Rejection
from tests.faults.hostile import DLQ, RawRecord, hostile_records

NOW = 1_800_000_000_000


def test_each_hostile_kind_ends_as_its_outcome() -> None:
    keyring = generate_keyring()
    machines = builtin_machines()
    run = decide_record(
        b"r1",
        b'{"run_id": "r1", "proposal_id": "c", "event": "create", "payload": {"machine": "run_state"}}',
        None,
        NOW,
        keyring=keyring,
        machines=machines,
        lookup=lambda _: None,
    )
    assert isinstance(run, Rejection)  # unsigned: proves nothing is decided before auth
    good = [RawRecord(b"r1", b'{"run_id": "r1", "event": "start"}', [])]
    records = hostile_records(["r1"], good, 400, keyring)
    kinds: Counter[str] = Counter()
    for record in records:
        outcome = decide_record(
            record.key,
            record.value,
            record.headers,
            NOW,
            keyring=keyring,
            machines=machines,
            lookup=lambda _: None,
        )
        kinds[record.kind] += 1
        if record.expect is None:
            continue
        if record.expect == DLQ:
            assert isinstance(outcome, DeadLetterReason), (record.kind, outcome)
        else:
            assert not isinstance(outcome, Commit | DeadLetterReason), (record.kind, outcome)
            assert outcome.code.value == record.expect or (
                # on a run that does not exist, a well-formed signed proposal is refused
                # unknown_run before its event or revision is looked at
                outcome.code.value == "unknown_run"
                and record.kind in ("unknown event", "absurd revision")
            ), (record.kind, outcome.code, outcome.detail)
    assert len(kinds) >= 17
