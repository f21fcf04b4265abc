"""Wire contracts: strict validation and JSON Schema files that match the models."""

import json

import pytest
from pydantic import ValidationError

from schemas import Proposal, RunSnapshot, Transition
from schemas.export import JSON_DIR, render_all


def test_json_schema_files_match_the_models() -> None:
    expected = render_all()
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in JSON_DIR.glob("*.json")}
    stale = sorted(name for name in expected if on_disk.get(name) != expected[name])
    extra = sorted(set(on_disk) - set(expected))
    assert not stale and not extra, (
        f"schemas/json is out of date (stale {stale}, extra {extra}); "
        "run `python -m schemas.export` and commit the result"
    )


def test_every_message_schema_carries_schema_version() -> None:
    for name in (
        "proposal",
        "transition",
        "rejection",
        "run_snapshot",
        "machine_spec",
        "dead_letter",
    ):
        schema = json.loads((JSON_DIR / f"{name}.schema.json").read_text())
        assert "schema_version" in schema["properties"], name
        assert schema.get("additionalProperties") is False, name


@pytest.mark.parametrize(
    "patch",
    [
        {"proposal_id": 7},
        {"event": ""},
        {"event": "has space"},
        {"expected_revision": -1},
        {"expected_revision": True},
        {"payload": "not an object"},
        {"source": "runtime"},
    ],
)
def test_proposal_is_strict(patch: dict[str, object]) -> None:
    value = {"proposal_id": "p", "run_id": "r", "event": "start", **patch}
    with pytest.raises(ValidationError):
        Proposal.model_validate_json(json.dumps(value))


def test_messages_round_trip_through_json() -> None:
    from tests.unit.driver import Driver

    run = Driver()
    run.create("task_lifecycle", max_retries=2, deadlines={"approval_timeout_ms": 1000})
    commit = run.commit("start")
    snapshot = RunSnapshot.model_validate_json(commit.snapshot.model_dump_json())
    assert snapshot == commit.snapshot
    transition = Transition.model_validate_json(commit.transition.model_dump_json())
    assert transition == commit.transition
    assert snapshot.deadlines.approval_timeout_ms == 1000


def test_missing_schema_version_means_current() -> None:
    proposal = Proposal.model_validate_json(b'{"proposal_id":"p","run_id":"r","event":"start"}')
    assert proposal.schema_version == 1


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("payload", {"n": 2**53}, "integer 9007199254740992 at .n "),
        ("payload", {"a": [1, {"b": -(2**53)}]}, "integer -9007199254740992 at .a[1].b "),
        ("metadata", {"x": [10**30]}, "integer of 100 bits at .x[0] "),
    ],
)
def test_proposal_integers_are_within_what_every_json_reader_keeps(
    field: str, value: object, where: str
) -> None:
    """RFC 8785 (canonical JSON for hashing) refuses integers beyond ±(2**53-1): a
    proposal that carries one is refused where it comes in, never when it is hashed."""
    proposal = {"proposal_id": "p", "run_id": "r", "event": "start", field: value}
    with pytest.raises(ValidationError) as refused:
        Proposal.model_validate_json(json.dumps(proposal))
    assert where in str(refused.value) and "I-JSON" in str(refused.value)
    edge = {"n": [2**53 - 1, -(2**53 - 1)], "t": True, "f": 1e300}
    ok = {"proposal_id": "p", "run_id": "r", "event": "start", field: edge}
    assert getattr(Proposal.model_validate_json(json.dumps(ok)), field) == edge


def test_machine_spec_integers_are_within_what_every_json_reader_keeps() -> None:
    from processor.engine.parse import parse_machine
    from processor.machines import builtin_source

    text = builtin_source("task_lifecycle")
    assert "retention_ms" not in text
    parse_machine(text + f"retention_ms: {2**53 - 1}\n")
    with pytest.raises(ValueError, match="retention_ms"):
        parse_machine(text + f"retention_ms: {2**53}\n")
