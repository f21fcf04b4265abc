"""A machine version is operator authority: a record of the machines topic takes effect
only signed by an operator's key valid when it was appended; the versions the package
ships (the built-ins and their history) need no signature."""

import json
from dataclasses import dataclass
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.engine.machine import Machine
from processor.engine.parse import parse_machine
from processor.history.audit import Record, verify_migrations
from processor.history.versions import check_version, held_versions, sort_versions, version_key
from processor.machines import builtin_history, builtin_machines, builtin_source, load_catalog
from processor.records.intake import TimestampType
from processor.trust.keygen import generate_keys, new_key
from processor.trust.keyring import Keyring, SigningKey
from processor.trust.signatures import Algorithm
from schemas.messages import Principal, Proposal, Transition
from tests.examples import examples

pytestmark = pytest.mark.unit

TOPIC = "runstate.machines"
NOW = 1_800_000_000_000
YEAR_MS = 365 * 24 * 3600 * 1000
KEYRING, SIGNERS = generate_keys(Algorithm.HMAC_SHA256)
ED_ENTRY, ED_SIGNER = new_key(
    "ops-ed", Algorithm.ED25519, "operator:alice", "runtime", operator=True
)
KEYRING = KEYRING.model_copy(update={"keys": {**KEYRING.keys, "ops-ed": ED_ENTRY}})
SIGNERS = {**SIGNERS, "ops-ed": ED_SIGNER}
OPERATORS = ["operator", "ops-ed"]
NOT_OPERATORS = ["runtime", "tool", "model", "approver"]


def _version(label: str) -> Machine:
    """task_lifecycle edited: a version nobody ships."""
    return parse_machine(
        builtin_source("task_lifecycle").replace(
            "name: task_lifecycle", f"name: task_lifecycle\nlabel: {json.dumps(label)}"
        )
    )


def _value(machine: Machine) -> bytes:
    return machine.spec.model_dump_json(by_alias=True).encode()


def _signed(machine: Machine, signer: SigningKey, signed_at: int) -> tuple[bytes, bytes, list]:
    key, value = version_key(machine), _value(machine)
    return key, value, signer.headers(TOPIC, key, value, signed_at)


labels = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=30)


@settings(max_examples=examples(40), deadline=None)
@given(label=labels, operator=st.sampled_from(OPERATORS), age=st.integers(0, 10 * YEAR_MS))
def test_an_operators_signature_makes_a_version_take_effect_however_old(
    label: str, operator: str, age: int
) -> None:
    machine = _version(label)
    key, value, headers = _signed(machine, SIGNERS[operator], NOW - age)
    checked = check_version(TOPIC, key, value, headers, NOW, KEYRING)
    assert isinstance(checked, tuple), checked
    assert checked[0].version == machine.version and checked[1] is True


@settings(max_examples=examples(40), deadline=None)
@given(label=labels, key_id=st.sampled_from(NOT_OPERATORS))
def test_a_key_that_is_not_an_operators_is_refused(label: str, key_id: str) -> None:
    key, value, headers = _signed(_version(label), SIGNERS[key_id], NOW)
    refused = check_version(TOPIC, key, value, headers, NOW, KEYRING)
    assert isinstance(refused, str) and "not an operator's key" in refused
    assert f"'{key_id}'" in refused


@settings(max_examples=examples(40), deadline=None)
@given(label=labels, drop=st.sets(st.integers(0, 2), min_size=1))
def test_an_unsigned_version_is_refused(label: str, drop: set[int]) -> None:
    key, value, headers = _signed(_version(label), SIGNERS["operator"], NOW)
    kept = [h for i, h in enumerate(headers) if i not in drop]
    refused = check_version(TOPIC, key, value, kept, NOW, KEYRING)
    assert isinstance(refused, str) and "machines publish" in refused


@settings(max_examples=examples(40), deadline=None)
@given(label=labels, operator=st.sampled_from(OPERATORS), other=st.sampled_from(OPERATORS))
def test_a_signature_under_an_operators_key_id_by_another_key_is_refused(
    label: str, operator: str, other: str
) -> None:
    """The operator's key id in the headers, but signed with a key that is not its own:
    a stranger's HMAC secret or Ed25519 private key."""
    stranger = (
        SigningKey(key_id=operator, algorithm=Algorithm.HMAC_SHA256, secret="s" * 32)
        if other == "operator"
        else new_key(operator, Algorithm.ED25519, "x", "runtime")[1]
    )
    key, value, headers = _signed(_version(label), stranger, NOW)
    refused = check_version(TOPIC, key, value, headers, NOW, KEYRING)
    assert isinstance(refused, str) and "bad signature" in refused


@settings(max_examples=examples(40), deadline=None)
@given(signed=labels, published=labels, operator=st.sampled_from(OPERATORS))
def test_a_value_other_than_the_one_signed_is_refused(
    signed: str, published: str, operator: str
) -> None:
    """An operator signed one version; another is published under its signature (keyed
    by its own version, so that the key matches the content)."""
    original, tampered = _version(signed), _version(published)
    _, _, headers = _signed(original, SIGNERS[operator], NOW)
    checked = check_version(TOPIC, version_key(tampered), _value(tampered), headers, NOW, KEYRING)
    if tampered.version == original.version:
        assert isinstance(checked, tuple)
    else:
        assert isinstance(checked, str) and "bad signature" in checked
    # and the signed one under another topic's name is not the signed one either
    key, value, headers = _signed(original, SIGNERS[operator], NOW)
    assert isinstance(check_version("other.machines", key, value, headers, NOW, KEYRING), str)


@settings(max_examples=examples(60), deadline=None)
@given(
    operator=st.sampled_from(OPERATORS),
    revoked_in=st.integers(-YEAR_MS, YEAR_MS),
    not_after_in=st.none() | st.integers(-YEAR_MS, YEAR_MS),
)
def test_the_key_must_be_valid_when_the_record_was_appended(
    operator: str, revoked_in: int, not_after_in: int | None
) -> None:
    entry = KEYRING.keys[operator].model_copy(
        update={
            "revoked_at_ms": NOW + revoked_in,
            "not_after_ms": None if not_after_in is None else NOW + not_after_in,
        }
    )
    keyring = KEYRING.model_copy(update={"keys": {**KEYRING.keys, operator: entry}})
    key, value, headers = _signed(_version("rotated"), SIGNERS[operator], NOW - YEAR_MS)
    checked = check_version(TOPIC, key, value, headers, NOW, keyring)
    valid = revoked_in > 0 and (not_after_in is None or not_after_in > 0)
    if valid:
        assert isinstance(checked, tuple) and checked[1] is True
    else:
        assert isinstance(checked, str)
        assert "revoked" in checked or "expired" in checked


def test_an_operator_key_limited_to_other_machines_is_refused() -> None:
    entry = KEYRING.keys["operator"].model_copy(update={"machines": ("run_state",)})
    keyring = KEYRING.model_copy(update={"keys": {**KEYRING.keys, "operator": entry}})
    key, value, headers = _signed(_version("x"), SIGNERS["operator"], NOW)
    refused = check_version(TOPIC, key, value, headers, NOW, keyring)
    assert isinstance(refused, str) and "limited to machines run_state" in refused


def test_no_keyring_takes_only_the_versions_held_here() -> None:
    key, value, headers = _signed(_version("x"), SIGNERS["operator"], NOW)
    assert isinstance(check_version(TOPIC, key, value, headers, NOW, None), str)


@settings(max_examples=examples(30), deadline=None)
@given(key_id=st.sampled_from([None, *NOT_OPERATORS]), keyless=st.booleans())
def test_a_shipped_version_takes_effect_unsigned_or_signed_by_anyone(
    key_id: str | None, keyless: bool
) -> None:
    """Logs from before the rule hold the built-ins unsigned: they are the package's."""
    held = held_versions(load_catalog())
    for machine in builtin_history():
        key, value = version_key(machine), _value(machine)
        headers = [] if key_id is None else SIGNERS[key_id].headers(TOPIC, key, value, NOW)
        checked = check_version(TOPIC, key, value, headers, NOW, None if keyless else KEYRING, held)
        assert isinstance(checked, tuple) and checked[0].version == machine.version


def test_not_a_machine_or_a_key_that_is_not_its_version_is_refused() -> None:
    machine = _version("a")
    _, value, headers = _signed(machine, SIGNERS["operator"], NOW)
    wrong = b"task_lifecycle@0000000000000000"
    assert "not what its key says" in str(check_version(TOPIC, wrong, value, headers, NOW, KEYRING))
    assert "not a machine" in str(check_version(TOPIC, wrong, b"{}", headers, NOW, KEYRING))


@dataclass
class _Msg:
    """What sort_versions reads of a consumed record."""

    k: bytes | None
    v: bytes | None
    h: list
    at: int
    off: int

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.v

    def headers(self) -> list:
        return self.h

    def timestamp(self) -> tuple[int, int]:
        return (2, self.at)

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self.off


def test_the_topic_read_as_a_whole() -> None:
    """An unsigned copy an operator's publish supersedes is not reported; a refusal after
    an accepted record is (compaction would keep it); a tombstone drops a version."""
    a, b, c = _version("a"), _version("b"), _version("c")
    ka, va, _ = _signed(a, SIGNERS["operator"], NOW)
    kb, vb, hb = _signed(b, SIGNERS["operator"], NOW)
    kc, vc, hc = _signed(c, SIGNERS["runtime"], NOW)
    _, _, ha = _signed(a, SIGNERS["operator"], NOW)
    messages = [
        _Msg(ka, va, [], NOW, 0),  # unsigned, then signed: fine
        _Msg(ka, va, ha, NOW, 1),
        _Msg(kb, vb, hb, NOW, 2),
        _Msg(kb, b"garbage", hb, NOW, 3),  # after the signed one: reported
        _Msg(kc, vc, hc, NOW, 4),  # the runtime's: reported
        _Msg(ka, None, [], NOW, 5),  # a's tombstone
    ]
    found = sort_versions(TOPIC, messages, KEYRING, held=())
    assert {m.version for m in found.accepted} == {b.version}
    assert found.signed == {kb}
    assert [r.offset for r in found.refused] == [3, 4]


def test_the_history_holds_every_builtin_version_by_name() -> None:
    """Each history file is named `<name>@<version>` of its content, and the current
    built-ins are in it: a later edit of one keeps the runs pinned to it decided."""
    folder = resources.files("processor.machines").joinpath("history")
    names = sorted(e.name for e in folder.iterdir() if e.name.endswith(".yaml"))
    history = builtin_history()
    assert names == sorted(f"{version_key(m).decode()}.yaml" for m in history)
    held = held_versions(load_catalog())
    assert {version_key(m) for m in builtin_machines().values()} <= {
        version_key(m) for m in history
    }
    assert {version_key(m) for m in history} <= held


def _record(offset: int, value: bytes, headers: list, key: bytes = b"r-1") -> Record:
    return Record(0, offset, key, value, headers, NOW)


@pytest.mark.parametrize("key_id", [*OPERATORS, *NOT_OPERATORS])
def test_verify_names_a_migration_no_operator_proposed(key_id: str) -> None:
    proposal = Proposal(
        proposal_id="p-mig", run_id="r-1", event="migrate", payload={"version": "0" * 16}
    )
    raw = proposal.model_dump_json(exclude_none=True).encode()
    headers = SIGNERS[key_id].headers("runstate.proposals", b"r-1", raw, NOW)
    transition = Transition.model_validate(
        {
            "transition_id": "r-1:3",
            "proposal_id": "p-mig",
            "run_id": "r-1",
            "machine": "task_lifecycle",
            "machine_version": "0" * 16,
            "event": "migrate",
            "from_state": "running",
            "to_state": "running",
            "revision": 3,
            "principal": Principal(source="runtime", authority="runtime").model_dump(),
            "at_ms": NOW,
            "prev_hash": "",
            "hash": "",
        }
    )
    found = verify_migrations(
        0,
        [_record(7, raw, headers)],
        [_record(3, transition.model_dump_json().encode(), [])],
        topic="runstate.proposals",
        keyring=KEYRING,
    )
    if key_id in OPERATORS:
        assert found == []
    else:
        assert len(found) == 1 and found[0].offset == 3 and f"'{key_id}'" in found[0].detail


def test_an_operators_keyring_entry_gives_an_operator_scope_and_only_it() -> None:
    for key_id, entry in KEYRING.keys.items():
        scope = entry.scope(key_id)
        assert (scope is not None and scope.operator) is (key_id in OPERATORS)
    assert isinstance(KEYRING, Keyring)


@pytest.mark.parametrize("timestamp_type", [TimestampType.CREATE_TIME, TimestampType.NOT_AVAILABLE])
def test_a_version_dated_by_its_producer_takes_no_effect(timestamp_type: TimestampType) -> None:
    """A key's revocation is judged by the broker's time: on a machines topic whose
    records carry the producer's time, a revoked operator key could date its record
    before its revocation. Such a record takes no effect, however well signed."""
    key, value, headers = _signed(_version("dated"), SIGNERS["operator"], NOW)
    assert not isinstance(check_version(TOPIC, key, value, headers, NOW, KEYRING), str)
    refused = check_version(TOPIC, key, value, headers, NOW, KEYRING, (), timestamp_type)
    assert isinstance(refused, str) and "LogAppendTime" in refused
