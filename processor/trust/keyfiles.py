"""Keyring files changed in place: keys generated, added, rotated and revoked, and each
new key's signing half written beside them (what `runstate keys` does).

Every change is computed on a `Keyring` first (the `*_key` functions, no file touched),
then written: the producer's signing key first, the keyring last, each file replaced
whole. The time a change takes effect is an argument: the caller's clock decides it.
"""

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from processor.trust.keygen import generate_keys, new_key
from processor.trust.keyring import (
    KeyEntry,
    Keyring,
    KeyringError,
    SigningKey,
    dump_keyring,
    dump_signing_key,
    load_keyring,
)
from processor.trust.signatures import Algorithm

#: The keyring is readable by every worker and auditor; a signing key by its owner only.
KEYRING_MODE = 0o644
SIGNING_KEY_MODE = 0o600


@dataclass(frozen=True)
class Generated:
    keyring: Path
    signing_keys: dict[str, Path]


@dataclass(frozen=True)
class Added:
    key_id: str
    not_before_ms: int
    signing_key: Path


@dataclass(frozen=True)
class Rotated:
    key_id: str
    new_key_id: str
    not_before_ms: int
    old_not_after_ms: int | None
    signing_key: Path


@dataclass(frozen=True)
class KeyLimits:
    """What a new key may prove beyond its principal (None: no limit, no such role)."""

    not_after_ms: int | None = None
    machines: tuple[str, ...] | None = None
    run_prefixes: tuple[str, ...] | None = None
    operator: bool | None = None
    processor: bool | None = None


def read_keyring(path: Path, missing_ok: bool = False) -> Keyring:
    """The keyring in `path`; an empty one when `missing_ok` and there is no file."""
    if missing_ok and not path.exists():
        return Keyring(keys={})
    return load_keyring(path, None)


def entry_of(keyring: Keyring, key_id: str) -> KeyEntry:
    entry = keyring.keys.get(key_id)
    if entry is None:
        raise KeyringError(
            f"no key '{key_id}' in the keyring; have: {', '.join(sorted(keyring.keys))}"
        )
    return entry


def next_key_id(key_id: str, keyring: Keyring) -> str:
    """`key_id` with its trailing .N counted up (or .2 added), to the first id free in
    `keyring`."""
    found = re.fullmatch(r"(.*)\.([0-9]+)", key_id)
    base, n = (found.group(1), int(found.group(2))) if found else (key_id, 1)
    while f"{base}.{n}" in keyring.keys or n == 1:
        n += 1
    return f"{base}.{n}"


def default_private_dir(keyring_path: Path) -> Path:
    """Where `generate` writes the signing keys unless told: beside the keyring, in
    <keyring stem>.private/."""
    return keyring_path.parent / f"{keyring_path.stem}.private"


def default_signing_key_path(key_id: str) -> Path:
    """Where a new key's signing half goes unless told: ./<key id>.key.json."""
    return Path(f"{key_id}.key.json")


def added_key(
    keyring: Keyring,
    key_id: str,
    algorithm: Algorithm,
    source: str,
    authority: str,
    not_before_ms: int,
    limits: KeyLimits,
) -> tuple[Keyring, SigningKey]:
    """`keyring` with a fresh key `key_id` valid from `not_before_ms`, and its signing
    half. KeyringError when the id is taken or the key is not one a keyring holds."""
    if key_id in keyring.keys:
        raise KeyringError(f"key '{key_id}' is already in the keyring")
    try:
        entry, signing = new_key(
            key_id,
            algorithm,
            source,
            authority,
            not_before_ms=not_before_ms,
            not_after_ms=limits.not_after_ms,
            machines=limits.machines,
            run_prefixes=limits.run_prefixes,
            operator=limits.operator,
            processor=limits.processor,
        )
    except ValueError as exc:
        raise KeyringError(str(exc)) from exc
    return keyring.model_copy(update={"keys": {**keyring.keys, key_id: entry}}), signing


def rotated_key(
    keyring: Keyring, key_id: str, new_key_id: str, not_before_ms: int, overlap_ms: int
) -> tuple[Keyring, SigningKey]:
    """`keyring` with `new_key_id` replacing `key_id`: the same principal and scope,
    valid from `not_before_ms`; the old key expires `overlap_ms` later (or keeps an
    earlier expiry of its own)."""
    old = entry_of(keyring, key_id)
    if new_key_id in keyring.keys:
        raise KeyringError(f"key '{new_key_id}' is already in the keyring")
    ends = not_before_ms + overlap_ms
    entry, signing = new_key(
        new_key_id,
        old.algorithm,
        old.source,
        old.authority,
        not_before_ms=not_before_ms,
        not_after_ms=old.not_after_ms,
        machines=old.machines,
        run_prefixes=old.run_prefixes,
        operator=old.operator,
        processor=old.processor,
    )
    if old.not_after_ms is None or old.not_after_ms > ends:
        old = old.model_copy(update={"not_after_ms": ends})
    updated = {**keyring.keys, key_id: old, new_key_id: entry}
    return keyring.model_copy(update={"keys": updated}), signing


def revoked_key(keyring: Keyring, key_id: str, at_ms: int) -> Keyring:
    """`keyring` with `key_id` revoked from `at_ms` on; KeyringError when it is revoked
    by then already."""
    entry = entry_of(keyring, key_id)
    if entry.revoked_at_ms is not None and entry.revoked_at_ms <= at_ms:
        raise KeyringError(f"key '{key_id}' is revoked already (at {entry.revoked_at_ms})")
    revoked = entry.model_copy(update={"revoked_at_ms": at_ms})
    return keyring.model_copy(update={"keys": {**keyring.keys, key_id: revoked}})


def key_listing(keyring: Keyring, now_ms: int) -> list[dict[str, object]]:
    """Each key's principal, validity and scope, and whether it is valid at `now_ms`,
    by key id; never a secret."""
    shown: list[dict[str, object]] = []
    for key_id, entry in sorted(keyring.keys.items()):
        fields = entry.model_dump(mode="json", exclude_none=True, exclude={"secret"})
        refused = entry.refuses_at(key_id, now_ms)
        shown.append({"key_id": key_id, **fields, "valid_now": refused is None})
    return shown


def generate(path: Path, algorithm: Algorithm, private_dir: Path | None = None) -> Generated:
    """Write a new keyring of the standard principals to `path` (replacing any) and each
    key's signing half to `private_dir` (default: `default_private_dir(path)`) as
    <key id>.key.json."""
    keyring, signing = generate_keys(algorithm)
    directory = private_dir or default_private_dir(path)
    directory.mkdir(parents=True, exist_ok=True)
    written = {k: write_signing_key(directory / f"{k}.key.json", s) for k, s in signing.items()}
    write_keyring(path, keyring)
    return Generated(path, written)


def add(
    path: Path,
    key_id: str,
    algorithm: Algorithm,
    source: str,
    authority: str,
    not_before_ms: int,
    limits: KeyLimits,
    signing_key_out: Path | None = None,
) -> Added:
    """Add `added_key` to the keyring file `path` (created if missing)."""
    keyring = read_keyring(path, missing_ok=True)
    if key_id in keyring.keys:
        raise KeyringError(f"key '{key_id}' is already in {path}")
    updated, signing = added_key(
        keyring, key_id, algorithm, source, authority, not_before_ms, limits
    )
    out = write_signing_key(signing_key_out or default_signing_key_path(key_id), signing)
    write_keyring(path, updated)
    return Added(key_id, not_before_ms, out)


def rotate(
    path: Path,
    key_id: str,
    not_before_ms: int,
    overlap_ms: int,
    new_key_id: str | None = None,
    signing_key_out: Path | None = None,
) -> Rotated:
    """`rotated_key` in the keyring file `path`; the new id defaults to `next_key_id`."""
    keyring = read_keyring(path)
    entry_of(keyring, key_id)
    fresh_id = new_key_id or next_key_id(key_id, keyring)
    if fresh_id in keyring.keys:
        raise KeyringError(f"key '{fresh_id}' is already in {path}")
    updated, signing = rotated_key(keyring, key_id, fresh_id, not_before_ms, overlap_ms)
    out = write_signing_key(signing_key_out or default_signing_key_path(fresh_id), signing)
    write_keyring(path, updated)
    old_not_after_ms = updated.keys[key_id].not_after_ms
    return Rotated(key_id, fresh_id, not_before_ms, old_not_after_ms, out)


def revoke(path: Path, key_id: str, at_ms: int) -> None:
    """`revoked_key` in the keyring file `path`."""
    write_keyring(path, revoked_key(read_keyring(path), key_id, at_ms))


def write_keyring(path: Path, keyring: Keyring) -> None:
    """Replace the file whole (write, then rename): a worker reading it again never
    sees half of it."""
    replace_file(path, dump_keyring(keyring), KEYRING_MODE)


def write_signing_key(path: Path, key: SigningKey) -> Path:
    replace_file(path, dump_signing_key(key), SIGNING_KEY_MODE)
    return path


def replace_file(path: Path, text: str, mode: int) -> None:
    """Write `text` to `path` with `mode` through a temporary file renamed over it: a
    reader sees the old file or the new one, and a secret is never readable by others,
    not even while it is written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
