"""Every kind of hostile record ends as the outcome it must: a DLQ record, a rejection
with its code, or (hostile-looking but valid input) a commit, never an exception (the
pure pipeline, no broker)."""

import json
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from processor.engine import Commit
from processor.keyring import generate_keyring
from processor.machines import builtin_machines
from processor.pipeline import DeadLetterReason, decide_record
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
        }
    )
    assert new_kinds <= set(kinds), sorted(new_kinds - set(kinds))
    assert len(kinds) >= 17 + len(new_kinds)


_SCALARS = (
    st.none()
    | st.booleans()
    | st.sampled_from([0, 1, 2, -1, 2**53, 2**64, 1.0, 1e400])
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=8)
    | st.sampled_from(["", "r1", "tool_result", "a b", "\x00", "\u0085", "é" * 70])
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
_OBJECTS = st.dictionaries(st.text(max_size=3), _JSON, max_size=3)
#: Each field mostly valid, sometimes not, sometimes absent: proposals that validate,
#: and ones that fail on one field, or on the version alone.
_PROPOSALS = st.fixed_dictionaries(
    {
        "proposal_id": st.sampled_from(["p", "p", "p", "", "\x00", 7, "é" * 40, "é" * 70]),
        "run_id": st.sampled_from(["r1", "r1", "r1", "", "\x7f", None, "é" * 100]),
        "event": st.sampled_from(["tool_result", "tool_result", "create", "a b", "", 3]),
    },
    optional={
        "schema_version": st.sampled_from([1, 1, 0, 2, -1, True, "1", 1.0, None, 2**70]),
        "expected_revision": st.sampled_from([None, 0, 3, -1, 1.5, "3", True]),
        "reason": st.sampled_from([None, "why", "", "x" * 300, 5]),
        "payload": _OBJECTS | _OBJECTS | _JSON,
        "metadata": _OBJECTS | _OBJECTS | _JSON,
        "extra": _JSON,
    },
)


@settings(max_examples=400, deadline=None)
@given(_PROPOSALS)
def test_decoding_validates_exactly_as_the_proposal_model(fields: dict[str, object]) -> None:
    """decode_proposal's fast validation (Proposal's validator without its model-level
    version check, which is done after) gives Proposal's own object or error."""
    from pydantic import ValidationError

    from processor.intake import _validate_proposal
    from schemas.messages import Proposal

    raw = json.dumps(fields).encode()
    try:
        expected: Proposal | str = Proposal.model_validate_json(raw)
    except ValidationError as exc:
        expected = str(exc)
    try:
        got: Proposal | str = _validate_proposal(raw)
    except ValidationError as exc:
        got = str(exc)
    assert got == expected
    if isinstance(got, Proposal) and isinstance(expected, Proposal):
        assert type(got) is Proposal
        assert got.model_fields_set == expected.model_fields_set
