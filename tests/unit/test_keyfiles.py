"""Keyring files changed in place: generate, add, rotate, revoke; the clock is an argument."""

import json
from pathlib import Path

import pytest

from processor.trust import keyfiles
from processor.trust.keyfiles import KeyLimits
from processor.trust.keygen import new_key
from processor.trust.keyring import Keyring, KeyringError, load_keyring, load_signing_key
from processor.trust.signatures import Algorithm

pytestmark = pytest.mark.unit


def _ring(**keys: tuple[str, str]) -> Keyring:
    made = {k: new_key(k, Algorithm.ED25519, s, a)[0] for k, (s, a) in keys.items()}
    return Keyring(keys=made)


@pytest.mark.parametrize(
    ("key_id", "taken", "expected"),
    [
        ("approver", (), "approver.2"),
        ("approver.2", ("approver.3",), "approver.4"),
        ("approver.1", (), "approver.2"),
        ("a.b", (), "a.b.2"),
        ("v.9", (), "v.10"),
    ],
)
def test_the_next_key_id_counts_up_to_a_free_one(
    key_id: str, taken: tuple[str, ...], expected: str
) -> None:
    keyring = _ring(**{k: ("s", "a") for k in (key_id, *taken)})
    assert keyfiles.next_key_id(key_id, keyring) == expected


def test_an_added_key_starts_when_told_and_keeps_its_limits() -> None:
    limits = KeyLimits(not_after_ms=900, run_prefixes=("team-a/",), operator=True)
    keyring, signing = keyfiles.added_key(
        _ring(), "k", Algorithm.HMAC_SHA256, "s", "approver", 100, limits
    )
    entry = keyring.keys["k"]
    assert (entry.not_before_ms, entry.not_after_ms) == (100, 900)
    assert entry.run_prefixes == ("team-a/",) and entry.operator is True
    assert entry.machines is None and entry.processor is None
    assert signing.key_id == "k" and signing.secret == entry.secret
    with pytest.raises(KeyringError, match="already in the keyring"):
        keyfiles.added_key(keyring, "k", Algorithm.ED25519, "s", "a", 0, KeyLimits())
    with pytest.raises(KeyringError, match="key id"):
        keyfiles.added_key(keyring, "no spaces", Algorithm.ED25519, "s", "a", 0, KeyLimits())


def test_rotation_carries_the_scope_over_and_ends_the_old_key_after_the_overlap() -> None:
    keyring, _ = keyfiles.added_key(
        _ring(), "k", Algorithm.ED25519, "s", "a", 0, KeyLimits(machines=("run_state",))
    )
    rotated, signing = keyfiles.rotated_key(keyring, "k", "k.2", 1_000, 500)
    old, new = rotated.keys["k"], rotated.keys["k.2"]
    assert old.not_after_ms == 1_500 and new.not_before_ms == 1_000
    assert new.machines == ("run_state",) and (new.source, new.authority) == ("s", "a")
    assert new.public_key != old.public_key and signing.key_id == "k.2"
    # An old key that expires before the overlap ends keeps its own expiry.
    early = keyring.model_copy(
        update={"keys": {"k": keyring.keys["k"].model_copy(update={"not_after_ms": 1_200})}}
    )
    assert keyfiles.rotated_key(early, "k", "k.2", 1_000, 500)[0].keys["k"].not_after_ms == 1_200
    with pytest.raises(KeyringError, match="no key 'x' in the keyring; have: k"):
        keyfiles.rotated_key(keyring, "x", "x.2", 0, 0)


def test_a_revocation_takes_effect_at_its_time_once() -> None:
    keyring = keyfiles.revoked_key(_ring(k=("s", "a")), "k", 5_000)
    assert keyring.keys["k"].revoked_at_ms == 5_000
    # A later revocation moves it earlier; one at or after it is refused.
    assert keyfiles.revoked_key(keyring, "k", 4_000).keys["k"].revoked_at_ms == 4_000
    with pytest.raises(KeyringError, match=r"revoked already \(at 5000\)"):
        keyfiles.revoked_key(keyring, "k", 5_000)


def test_the_listing_shows_validity_at_the_time_given_and_no_secret() -> None:
    keyring, _ = keyfiles.added_key(
        _ring(), "h", Algorithm.HMAC_SHA256, "s", "a", 1_000, KeyLimits()
    )
    (before,) = keyfiles.key_listing(keyring, 999)
    (after,) = keyfiles.key_listing(keyring, 1_000)
    assert before["valid_now"] is False and after["valid_now"] is True
    assert "secret" not in after and after["key_id"] == "h"


def test_the_files_a_keys_life_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    ring = tmp_path / "ring.json"
    added = keyfiles.add(ring, "k", Algorithm.ED25519, "s", "a", 100, KeyLimits())
    assert added.signing_key == Path("k.key.json")
    assert oct((tmp_path / "k.key.json").stat().st_mode & 0o777) == "0o600"
    assert oct(ring.stat().st_mode & 0o777) == "0o644"
    assert load_signing_key(tmp_path / "k.key.json").key_id == "k"
    with pytest.raises(KeyringError, match=f"already in {ring}"):
        keyfiles.add(ring, "k", Algorithm.ED25519, "s", "a", 100, KeyLimits())

    rotated = keyfiles.rotate(ring, "k", 200, 50, signing_key_out=tmp_path / "n.json")
    assert (rotated.new_key_id, rotated.old_not_after_ms) == ("k.2", 250)
    with pytest.raises(KeyringError, match=f"key 'k.2' is already in {ring}"):
        keyfiles.rotate(ring, "k", 200, 50, new_key_id="k.2")

    keyfiles.revoke(ring, "k.2", 300)
    stored = load_keyring(ring, None)
    assert set(stored.keys) == {"k", "k.2"} and stored.keys["k.2"].revoked_at_ms == 300
    assert not list(tmp_path.glob(".ring.json.*"))  # no temporary file left behind

    with pytest.raises(KeyringError, match="cannot read keyring"):
        keyfiles.read_keyring(tmp_path / "none.json")
    assert keyfiles.read_keyring(tmp_path / "none.json", missing_ok=True).keys == {}


def test_a_generated_keyring_and_its_signing_keys(tmp_path: Path) -> None:
    ring = tmp_path / "ring.json"
    made = keyfiles.generate(ring, Algorithm.ED25519)
    assert made.keyring == ring
    assert set(made.signing_keys) == {"runtime", "tool", "model", "approver", "operator", "worker"}
    assert made.signing_keys["tool"] == tmp_path / "ring.private" / "tool.key.json"
    assert "private_key" not in ring.read_text()
    assert json.loads(made.signing_keys["tool"].read_text())["key_id"] == "tool"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f.json"
    target.write_text("old")

    def broken(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(keyfiles.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        keyfiles.replace_file(target, "new", 0o600)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.json"]
