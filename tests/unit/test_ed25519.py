"""The strict Ed25519 rule (processor/trust/ed25519.py): keys of small or mixed order, not
canonical or off the curve never load into a keyring and verify nothing; signatures with
S >= L or a small-order R never verify; the rule agrees with libsodium's
crypto_sign_verify_detached wherever the key is one a keyring holds. Every verification
here is made by both implementations the worker may use (libsodium through PyNaCl, and
`cryptography`), which must agree.

The hostile inputs come from tests/ed25519_ref.py, an independent lax Ed25519 whose
forgeries satisfy RFC 8032's equation, as OpenSSL checks it: each test first shows the
forgery is a real one, so that refusing it is the rule's doing."""

import ctypes
import ctypes.util
import json
import logging
import os
import time
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.cli.main import cli
from processor.records.intake import Credential, authenticate
from processor.trust import signatures
from processor.trust.ed25519 import SMALL_ORDER_Y, public_key_problem, signature_problem
from processor.trust.keyring import (
    KeyEntry,
    Keyring,
    KeyringError,
    KeyringWatch,
    SigningKey,
    load_keyring,
    parse_keyring,
)
from processor.trust.signatures import Algorithm, ed25519_public_key, ed25519_signature
from tests import ed25519_ref as ref
from tests.examples import examples
from tests.vectors import VECTORS

pytestmark = pytest.mark.unit

TORSION = ref.torsion_encodings()
TORSION_POINTS = ref.torsion_points()
Y_MASK = (1 << 255) - 1


def _keyring_text(public_key: str, key_id: str = "k") -> str:
    entry = {"algorithm": "ed25519", "public_key": public_key, "source": "s", "authority": "a"}
    return json.dumps({"keys": {key_id: entry}})


def _loads(public_key: str) -> bool:
    try:
        parse_keyring(_keyring_text(public_key), "test")
    except KeyringError:
        return False
    return True


@cache
def _libsodium() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("sodium")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    if lib.sodium_init() < 0:
        return None
    return lib


def _sodium_verifies(public: bytes, message: bytes, signature: bytes) -> bool:
    lib = _libsodium()
    assert lib is not None
    verify = lib.crypto_sign_verify_detached
    return bool(verify(signature, message, ctypes.c_ulonglong(len(message)), public) == 0)


def _openssl_verifies(public: bytes, message: bytes, signature: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def verify_ed25519(public_key_hex: str, message: bytes, signature_hex: str) -> bool:
    """`signatures.verify_ed25519` by libsodium and by `cryptography`: one answer."""
    installed, answers = signatures.HAVE_SODIUM, []
    for sodium in (True, False) if installed else (False,):
        signatures.HAVE_SODIUM = sodium
        try:
            answers.append(signatures.verify_ed25519(public_key_hex, message, signature_hex))
        finally:
            signatures.HAVE_SODIUM = installed
    assert len(set(answers)) == 1, f"libsodium and cryptography disagree: {answers}"
    return answers[0]


def test_the_worker_install_verifies_with_libsodium() -> None:
    """PyNaCl is in the worker extra: without it every Ed25519 verification costs about
    twice the CPU (`cryptography`), silently."""
    assert signatures.HAVE_SODIUM


# ------------------------------------------------------------------ the torsion, derived


def test_the_small_order_list_is_the_curve_torsion() -> None:
    """Eight points of order 1, 2, 4, 8; their encodings, canonical or not, are exactly
    the y coordinates the rule lists (libsodium's list)."""
    assert sorted(ref.order(t) for t in TORSION_POINTS) == [1, 2, 4, 4, 8, 8, 8, 8]
    assert all(ref.on_curve(t) for t in TORSION_POINTS)
    assert len({t for t in TORSION_POINTS}) == 8
    assert sum(form == "canonical" for _, _, form in TORSION) == 8
    assert {int.from_bytes(raw, "little") & Y_MASK for raw, _, _ in TORSION} == SMALL_ORDER_Y


def test_the_vectors_key_and_signature_hold_by_the_reference() -> None:
    seed = bytes(range(32))
    assert ref.public_key(seed).hex() == ed25519_public_key(seed.hex())
    signature = bytes.fromhex(ed25519_signature(seed.hex(), b"m"))
    assert ref.lax_verify(ref.public_key(seed), b"m", signature)


# ------------------------------------------------------------------ the vectors


def _vectors() -> dict[str, list[dict[str, str]]]:
    data = json.loads((VECTORS / "ed25519.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_every_torsion_encoding_is_a_refused_key_vector() -> None:
    keys = {k["public_key"]: k["expect"] for k in _vectors()["keys"]}
    for raw, _, _ in TORSION:
        assert keys[raw.hex()] == "refused"
    assert list(keys.values()).count("ok") == 1


def test_key_vectors_load_as_they_say_and_the_refusal_names_the_key() -> None:
    for case in _vectors()["keys"]:
        text = _keyring_text(case["public_key"], key_id="suspect-7")
        if case["expect"] == "ok":
            parse_keyring(text, "ring.json")
            continue
        with pytest.raises(KeyringError) as refused:
            parse_keyring(text, "ring.json")
        message = str(refused.value)
        assert "key id 'suspect-7'" in message and "ring.json" in message, message
        assert "Remove" in message, message
        assert public_key_problem(bytes.fromhex(case["public_key"])) is not None


def test_signature_vectors_verify_as_they_say_and_the_bad_ones_are_real_forgeries() -> None:
    """Every invalid vector but S + L satisfies RFC 8032's equation (the reference's lax
    check): OpenSSL's verify, without the rule in front of it, would accept it."""
    for case in _vectors()["signatures"]:
        public, message = bytes.fromhex(case["public_key"]), case["message"].encode()
        signature = bytes.fromhex(case["signature"])
        ours = verify_ed25519(case["public_key"], message, case["signature"])
        assert ("valid" if ours else "invalid") == case["expect"], case["name"]
        if case["name"] != "S + L":
            assert ref.lax_verify(public, message, signature), case["name"]


def test_openssl_alone_accepts_the_identity_forgery() -> None:
    """Why the rule is in front of `cryptography`: under the identity key, R = identity
    and S = 0 verify any message there."""
    identity = ref.encode(ref.IDENTITY)
    forged = identity + bytes(32)
    if not _openssl_verifies(identity, b"any message", forged):
        pytest.skip("this cryptography refuses the identity forgery by itself")
    assert not verify_ed25519(identity.hex(), b"any message", forged.hex())


@pytest.mark.skipif(_libsodium() is None, reason="libsodium is not installed")
def test_the_vectors_agree_with_libsodium_but_for_the_mixed_order_key() -> None:
    """libsodium refuses every refused signature but the one under a mixed-order key,
    which the rule refuses at keyring load (cofactored verifiers accept more there)."""
    for case in _vectors()["signatures"]:
        public, message = bytes.fromhex(case["public_key"]), case["message"].encode()
        sodium = _sodium_verifies(public, message, bytes.fromhex(case["signature"]))
        if case["name"].startswith("mixed-order key"):
            assert sodium and case["expect"] == "invalid"
        else:
            assert sodium == (case["expect"] == "valid"), case["name"]


# ------------------------------------------------------------------ properties

messages = st.binary(max_size=300)


@settings(max_examples=examples(150), deadline=None)
@given(which=st.sampled_from(TORSION), message=messages, s=st.integers(0, 2**256 - 1))
def test_no_small_order_key_loads_or_verifies(
    which: tuple[bytes, int, str], message: bytes, s: int
) -> None:
    raw, _, _ = which
    assert not _loads(raw.hex())
    forged = ref.forge_small_order(raw, message)
    if forged is not None:  # R = -[k]A, S = 0: RFC 8032's equation holds
        assert ref.lax_verify(raw, message, forged)
        assert not verify_ed25519(raw.hex(), message, forged.hex())
    for r, _, _ in TORSION:
        assert not verify_ed25519(raw.hex(), message, (r + s.to_bytes(32, "little")).hex())


@settings(max_examples=examples(100), deadline=None)
@given(y=st.integers(ref.P, 2**255 - 1), sign=st.integers(0, 1), message=messages)
def test_no_non_canonical_key_loads_or_verifies(y: int, sign: int, message: bytes) -> None:
    raw = (y | sign << 255).to_bytes(32, "little")
    assert public_key_problem(raw) is not None
    assert not _loads(raw.hex())
    forged = ref.forge_small_order(raw, message)
    signature = forged if forged is not None else bytes(64)
    assert not verify_ed25519(raw.hex(), message, signature.hex())


@settings(max_examples=examples(40), deadline=None)
@given(
    seed=st.binary(min_size=32, max_size=32),
    torsion=st.sampled_from([t for t in TORSION_POINTS if t != ref.IDENTITY]),
    message=messages,
)
def test_no_mixed_order_key_loads_or_verifies(
    seed: bytes, torsion: ref.Affine, message: bytes
) -> None:
    public = ref.mixed_order_key(seed, torsion)
    assert not _loads(public.hex())
    made = next(ref.sign_mixed(seed, torsion, message))
    assert ref.lax_verify(public, message, made)
    assert not verify_ed25519(public.hex(), message, made.hex())


@settings(max_examples=examples(150), deadline=None)
@given(raw=st.binary(min_size=32, max_size=32))
def test_a_key_loads_exactly_when_it_is_a_canonical_prime_order_point(raw: bytes) -> None:
    """Any 32 bytes: the rule against the reference's own arithmetic."""
    point = ref.decode_lax(raw)
    expected = (
        point is not None
        and ref.encode(point) == raw
        and point != ref.IDENTITY
        and ref.mul(ref.L, point) == ref.IDENTITY
    )
    assert (public_key_problem(raw) is None) == expected
    assert _loads(raw.hex()) == expected


@settings(max_examples=examples(150), deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), message=messages, add=st.integers(0, 2**256))
def test_s_at_or_past_l_never_verifies(seed: bytes, message: bytes, add: int) -> None:
    public = ed25519_public_key(seed.hex())
    signature = bytes.fromhex(ed25519_signature(seed.hex(), message))
    assert verify_ed25519(public, message, signature.hex())
    s = int.from_bytes(signature[32:], "little") + ref.L * (1 + add % 15)
    if s >= 2**256:
        s = ref.L + add % (2**256 - ref.L)
    bad = signature[:32] + s.to_bytes(32, "little")
    assert signature_problem(bad) is not None
    assert not verify_ed25519(public, message, bad.hex())


@settings(max_examples=examples(60), deadline=None)
@given(seed=st.binary(min_size=32, max_size=32), message=messages)
def test_the_key_holders_small_order_r_never_verifies(seed: bytes, message: bytes) -> None:
    made = ref.sign_with_identity_r(seed, message)
    public = ref.public_key(seed)
    assert ref.lax_verify(public, message, made)
    assert not verify_ed25519(public.hex(), message, made.hex())


@pytest.mark.skipif(_libsodium() is None, reason="libsodium is not installed")
@settings(max_examples=examples(200), deadline=None)
@given(
    seed=st.binary(min_size=32, max_size=32),
    message=messages,
    flip=st.one_of(st.none(), st.tuples(st.integers(0, 63), st.integers(0, 7))),
    s_plus_l=st.booleans(),
)
def test_the_rule_agrees_with_libsodium_on_keys_a_keyring_holds(
    seed: bytes, message: bytes, flip: tuple[int, int] | None, s_plus_l: bool
) -> None:
    public = ed25519_public_key(seed.hex())
    signature = bytearray(bytes.fromhex(ed25519_signature(seed.hex(), message)))
    if flip is not None:
        signature[flip[0]] ^= 1 << flip[1]
    if s_plus_l:
        s = int.from_bytes(signature[32:], "little") + ref.L
        if s < 2**256:
            signature[32:] = s.to_bytes(32, "little")
    ours = verify_ed25519(public, message, bytes(signature).hex())
    assert ours == _sodium_verifies(bytes.fromhex(public), message, bytes(signature))


# ------------------------------------------------------------------ where keyrings load


def test_a_record_signed_under_a_refused_key_is_unauthenticated() -> None:
    """Even a keyring built around the loader (model_construct) proves nothing with such
    a key: the one verification refuses it."""
    identity = ref.encode(ref.IDENTITY).hex()
    entry = KeyEntry.model_construct(
        algorithm=Algorithm.ED25519, public_key=identity, source="runtime", authority="runtime"
    )
    keyring = Keyring.model_construct(
        keys={"evil": entry}, signature_max_age_ms=300_000, clock_skew_ms=30_000
    )
    value = b'{"run_id":"r1","proposal_id":"p1","event":"start"}'
    forged = ref.encode(ref.IDENTITY).hex() + "00" * 32
    headers = [
        ("runstate-key-id", b"evil"),
        ("runstate-signed-at", b"1000"),
        ("runstate-signature", forged.encode()),
    ]
    result = authenticate("runstate.proposals", b"r1", value, headers, keyring, 1000)
    assert not isinstance(result, Credential)
    assert "bad signature" in result.why


def test_a_keyring_file_with_a_small_order_key_fails_at_load(tmp_path: Path) -> None:
    ring = tmp_path / "keys.json"
    ring.write_text(_keyring_text(TORSION[0][0].hex(), key_id="evil"), encoding="utf-8")
    with pytest.raises(KeyringError, match=r"key id 'evil'.*small order"):
        load_keyring(ring, None)
    with pytest.raises(KeyringError, match="key id 'evil'"):
        load_keyring(None, ring.read_text(encoding="utf-8"))


@settings(max_examples=examples(50), deadline=None)
@given(seed=st.binary(min_size=32, max_size=32))
def test_a_signing_keys_public_half_always_loads(seed: bytes) -> None:
    """A private key's public half is a prime-order point other than the identity: a
    producer's key never trips the rule."""
    key = SigningKey(key_id="a", algorithm="ed25519", private_key=seed.hex())
    assert key.private_key is not None
    assert _loads(ed25519_public_key(key.private_key))


@pytest.mark.parametrize(
    "command",
    [
        ["keys", "list", "--keyring-file", "{ring}"],
        ["keys", "revoke", "evil", "--keyring-file", "{ring}"],
        ["verify", "--keyring-file", "{ring}", "--bootstrap-servers", "127.0.0.1:1"],
        ["worker", "--keyring-file", "{ring}", "--bootstrap-servers", "127.0.0.1:1",
         "--state-dir", "{state}"],
    ],
    ids=["keys list", "keys revoke", "verify", "worker"],
)  # fmt: skip
def test_the_cli_stops_on_a_keyring_with_a_refused_key(
    tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At start, before any broker is reached (none answers here): the key id and why,
    no traceback, a failing exit."""
    monkeypatch.delenv("RUNSTATE_KEYRING", raising=False)
    ring = tmp_path / "keys.json"
    bad = next(raw for raw, order, _ in TORSION if order == 8).hex()
    ring.write_text(_keyring_text(bad, key_id="evil"), encoding="utf-8")
    args = [a.format(ring=ring, state=tmp_path / "state") for a in command]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0, result.output
    assert "key id 'evil'" in result.output and "small order" in result.output, result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, KeyringError), result.exception


def test_a_worker_does_not_take_a_keyring_file_changed_to_hold_a_refused_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ring = tmp_path / "keys.json"
    good = ed25519_public_key("11" * 32)
    ring.write_text(_keyring_text(good, key_id="good"), encoding="utf-8")
    watch = KeyringWatch(load_keyring(ring, None), ring, interval_s=0.0)
    bad = TORSION[0][0].hex()
    ring.write_text(_keyring_text(bad, key_id="evil-key-9"), encoding="utf-8")
    os.utime(ring, ns=(time.time_ns(), time.time_ns() + 10**9))
    with caplog.at_level(logging.ERROR, logger="processor.trust.keyring"):
        assert set(watch.current().keys) == {"good"}
    assert "key id 'evil-key-9'" in caplog.text
