"""docs/vectors match the product, and their values hold by independent means."""

import hashlib
import hmac
import json
from typing import Any

import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from hypothesis import given
from hypothesis import strategies as st

from processor.engine.scope import reaches
from processor.records.intake import Credential, Unproven, authenticate
from processor.trust.keyring import Keyring, KeyringError, SigningKey, parse_keyring
from processor.trust.signatures import signed_base
from schemas.codes import RejectionCode
from tests.vectors import VECTORS, render

pytestmark = pytest.mark.unit


def _load(name: str) -> object:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def test_vector_files_match_the_product() -> None:
    for name, text in render().items():
        assert (VECTORS / name).read_text(encoding="utf-8") == text, (
            f"docs/vectors/{name} is out of date: run `python -m tests.vectors` and commit it"
        )


def test_signature_vectors_verify_independently() -> None:
    data = _load("signatures.json")
    assert isinstance(data, dict)
    keys = {k["key_id"]: k for k in data["signing_keys"]}
    for case in data["cases"]:
        base = "\n".join(
            [
                "runstate-proposal-v1",
                case["topic"],
                case["key_id"],
                str(case["signed_at"]),
                hashlib.sha256(case["key"].encode()).hexdigest(),
                hashlib.sha256(case["value"].encode()).hexdigest(),
            ]
        ).encode()
        assert base.decode() == case["signed_base"]
        key = keys[case["key_id"]]
        if case["algorithm"] == "hmac-sha256":
            expected = hmac.new(key["secret"].encode(), base, hashlib.sha256).hexdigest()
            assert case["signature"] == expected
        else:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

            private = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(key["private_key"]))
            public: Ed25519PublicKey = private.public_key()
            public.verify(bytes.fromhex(case["signature"]), base)  # raises when wrong


def test_chain_vectors_hash_their_canonical_text() -> None:
    data = _load("chain.json")
    assert isinstance(data, dict)
    previous = ""
    for entry in data["transitions"]:
        assert hashlib.sha256(entry["canonical"].encode()).hexdigest() == entry["hash"]
        assert entry["transition"]["hash"] == entry["hash"]
        assert entry["transition"]["prev_hash"] == previous
        previous = entry["hash"]


def _digest(value: str, principal: dict[str, str]) -> str:
    """docs/wire.md §3, from the value as sent: independent of the proposal model."""
    proposal = json.loads(value)
    content = [
        proposal["event"],
        proposal.get("reason"),
        proposal.get("payload", {}),
        proposal.get("metadata", {}),
        principal["source"],
        principal["authority"],
    ]
    return hashlib.sha256(rfc8785.dumps(content)).hexdigest()


def test_digest_vectors_hash_their_content() -> None:
    data = _load("digests.json")
    assert isinstance(data, dict)
    for case in data["proposals"]:
        assert hashlib.sha256(case["canonical"].encode()).hexdigest() == case["digest"]
        assert _digest(case["value"], case["principal"]) == case["digest"], case["name"]
    for pair in data["pairs"]:
        first, second = (
            _digest(p["value"], p["principal"]) for p in (pair["first"], pair["second"])
        )
        assert pair["expect"] == ("same" if first == second else "reused"), pair["name"]
        assert (pair["second_outcome"] == "proposal_id_reused") == (pair["expect"] == "reused")
    assert {p["expect"] for p in data["pairs"]} == {"same", "reused"}


def _approval_outcome(case: dict[str, Any]) -> str:
    """docs/wire.md §3's bound approval, as the doc states it."""
    payload, run = case["payload"], case["run"]
    exact = all(
        type(payload.get(name)) is int and payload[name] >= 0 for name in ("pause", "expires_at_ms")
    )
    if set(payload) != {"pause", "expires_at_ms"} or not exact:
        return "schema_invalid"
    pause = run["pause"]
    if payload["pause"] != (run["revision"] if pause is None else pause["revision"]):
        return "approval_wrong_pause"
    if payload["expires_at_ms"] <= case["broker_time"]:
        return "approval_expired"
    if pause is not None and pause["asked_by"]["source"] == case["principal"]["source"]:
        return "self_approval"
    return "accepted"


def test_approval_vectors_follow_the_stated_rule() -> None:
    data = _load("approvals.json")
    assert isinstance(data, dict)
    for case in data["cases"]:
        assert _approval_outcome(case) == case["expect"], case["name"]
    expected = {"accepted", "approval_wrong_pause", "approval_expired", "self_approval"}
    assert expected | {"schema_invalid"} == {c["expect"] for c in data["cases"]}


@given(st.text(alphabet="ab-/é", max_size=4), st.text(alphabet="ab-/+é", max_size=6))
def test_scope_prefix_rule_as_stated(prefix: str, run_id: str) -> None:
    """A prefix reaches a run id equal to it, or one that goes on after it with a
    separator, or any run id it starts when it ends with a separator (or is empty)."""
    stated = run_id.startswith(prefix) and (
        run_id == prefix
        or prefix == ""
        or prefix[-1] in "-_.:/@#"
        or run_id[len(prefix)] in "-_.:/@#"
    )
    assert reaches(prefix, run_id) == stated


def test_scope_vectors() -> None:
    data = _load("scopes.json")
    assert isinstance(data, list)
    for case in data:
        assert reaches(case["prefix"], case["run_id"]) == case["reaches"], case
    assert {c["reaches"] for c in data} == {True, False}


@given(st.text(st.characters(exclude_categories=["Cs"]), min_size=16, max_size=40))
def test_hmac_key_is_the_utf8_of_the_decoded_secret(secret: str) -> None:
    """docs/wire.md §4: a secret written with JSON escapes keys the HMAC with the UTF-8
    of the string the escapes spell."""
    entry = {"secret": secret, "source": "s", "authority": "a"}
    escaped = json.dumps({"keys": {"k": entry}}, ensure_ascii=True)
    keyring = parse_keyring(escaped, "test")
    base = signed_base("runstate.proposals", b"r", b"{}", "k", 1)
    signature = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    credential = authenticate(
        "runstate.proposals",
        b"r",
        b"{}",
        [
            ("runstate-key-id", b"k"),
            ("runstate-signed-at", b"1"),
            ("runstate-signature", signature.encode()),
        ],
        keyring,
        1,
    )
    assert isinstance(credential, Credential)


def test_hmac_secret_with_a_lone_surrogate_does_not_load() -> None:
    text = '{"keys": {"k": {"secret": "\\ud800' + "a" * 16 + '", "source": "s", "authority": "a"}}}'
    with pytest.raises(KeyringError):
        parse_keyring(text, "test")


@given(st.sampled_from(["runstate-key-id", "runstate-signed-at", "runstate-signature"]), st.data())
def test_header_names_are_case_sensitive(name: str, data: st.DataObject) -> None:
    """docs/wire.md §4: another case of a header's name is not that header."""
    keyring = Keyring.model_validate(
        {"keys": {"k": {"secret": "s" * 16, "source": "s", "authority": "a"}}}
    )
    headers = SigningKey.hmac("k", "s" * 16).headers("runstate.proposals", b"r", b"{}", 1)
    cased = data.draw(
        st.lists(st.booleans(), min_size=len(name), max_size=len(name))
        .map(lambda upper: "".join(c.upper() if u else c for c, u in zip(name, upper, strict=True)))
        .filter(lambda n: n != name)
    )
    renamed = [(cased if h == name else h, v) for h, v in headers]
    result = authenticate("runstate.proposals", b"r", b"{}", renamed, keyring, 1)
    assert isinstance(result, Unproven) and result.code is RejectionCode.UNAUTHENTICATED
    # and a second copy under another case is no second copy
    doubled = [*headers, (cased, b"x")]
    assert isinstance(
        authenticate("runstate.proposals", b"r", b"{}", doubled, keyring, 1), Credential
    )


def test_continuation_vectors_hold_independently() -> None:
    data = _load("continuations.json")
    assert isinstance(data, dict)
    for case in data["relay_ids"]:
        raw = f"{case['run_id']}\x00{case['proposal_id']}".encode()
        assert case["relay_id"] == f"relay:{case['event']}:{hashlib.sha256(raw).hexdigest()}"
    for case in data["digests"]:
        rows = [
            [n, s.get("idempotency_key"), s.get("attempts", 1), s.get("result")]
            for n, s in sorted(case["steps"].items())
        ]
        assert case["steps_digest"] == hashlib.sha256(rfc8785.dumps([rows])).hexdigest()
        checkpoint = hashlib.sha256(rfc8785.dumps([case["checkpoint"]])).hexdigest()
        assert case["checkpoint_digest"] == checkpoint
