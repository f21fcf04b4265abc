"""Keyrings: which keys prove which principal, for which runs, and when.

A worker or an auditor holds a *keyring* (key id -> the key's verifying half, the
principal it proves, its validity and its scope). A producer holds only its own *signing
key* (key id + HMAC secret or Ed25519 private key). With Ed25519 keys a keyring holds
public keys only, so whoever verifies cannot sign; an HMAC key's secret verifies and
signs alike.

A worker loads its keyring from a file (RUNSTATE_KEYRING_FILE) and reads it again when
the file changes, or from JSON text (RUNSTATE_KEYRING). New keys are made in
`keygen.py`; `keyfiles.py` changes a keyring file in place (what `runstate keys` does).
"""

import json
import logging
import re
import time
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from processor.engine.scope import Scope
from processor.trust.ed25519 import public_key_problem_hex
from processor.trust.signatures import (
    HEADER_KEY_ID,
    HEADER_SIGNATURE,
    HEADER_SIGNED_AT,
    Algorithm,
    RecordHeaders,
    ed25519_signature,
    hmac_signature,
    is_hex_key,
    signed_base,
)
from schemas.base import describe_errors
from schemas.messages import Principal

log = logging.getLogger(__name__)

#: Key ids go into a header and, between line feeds, into the signed base.
_KEY_ID = re.compile(r"[A-Za-z0-9._:@-]{1,128}")


def _key_id(text: str) -> str:
    if not _KEY_ID.fullmatch(text):
        raise ValueError("a key id is 1-128 of A-Z a-z 0-9 . _ : @ -")
    return text


KeyId = Annotated[str, AfterValidator(_key_id)]


def _hex_key(text: str) -> str:
    if not is_hex_key(text):
        raise ValueError("an Ed25519 key is 32 bytes as 64 hex digits")
    return text.lower()


HexKey = Annotated[str, AfterValidator(_hex_key)]

#: The error type of a public key the strict Ed25519 rule refuses (processor/trust/ed25519.py).
_REFUSED_KEY = "ed25519_public_key_refused"


def _public_key(text: str) -> str:
    problem = public_key_problem_hex(text)
    if problem is not None:
        raise PydanticCustomError(
            _REFUSED_KEY, "ed25519 public key refused: {why}", {"why": problem}
        )
    return text


PublicKey = Annotated[HexKey, AfterValidator(_public_key)]


class KeyEntry(BaseModel):
    """One key as a verifier holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    algorithm: Algorithm = Algorithm.HMAC_SHA256
    secret: str | None = Field(
        default=None,
        min_length=16,
        description="hmac-sha256: the shared secret; its UTF-8 bytes key the HMAC.",
    )
    public_key: PublicKey | None = Field(
        default=None,
        description=(
            "ed25519: 32 bytes, hex, a key the strict rule accepts (processor/trust/ed25519.py)."
        ),
    )
    source: str = Field(min_length=1)
    authority: str = Field(min_length=1)
    not_before_ms: int | None = Field(
        default=None, description="Records appended before this time are refused."
    )
    not_after_ms: int | None = Field(
        default=None, description="Records appended at or after this time are refused."
    )
    revoked_at_ms: int | None = Field(
        default=None, description="Revoked: records appended at or after it are refused."
    )
    machines: tuple[str, ...] | None = Field(
        default=None, description="Only runs of these machines (None: any)."
    )
    run_prefixes: tuple[str, ...] | None = Field(
        default=None, description="Only runs whose id starts with one of these (None: any)."
    )
    operator: bool | None = Field(
        default=None,
        description="true: an operator's key, which signs machine versions and migrates "
        "runs (None, false: not).",
    )
    processor: bool | None = Field(
        default=None,
        description="true: a key of the workers themselves, which signs deadlines and "
        "the messages runs exchange (a continuation asked of its original run, and the "
        "answer); never give it to an agent (None, false: not).",
    )

    @model_validator(mode="after")
    def _one_verifier(self) -> Self:
        if self.algorithm is Algorithm.HMAC_SHA256 and (
            self.secret is None or self.public_key is not None
        ):
            raise ValueError("an hmac-sha256 key has a secret and no public_key")
        if self.algorithm is Algorithm.ED25519 and (
            self.public_key is None or self.secret is not None
        ):
            raise ValueError("an ed25519 key has a public_key and no secret")
        return self

    @property
    def principal(self) -> Principal:
        return _principal(self.source, self.authority)

    def scope(self, key_id: str) -> Scope | None:
        """None for a key without limits that is no operator's (the engine reads None
        as: any run, no operator authority)."""
        if (
            self.machines is None
            and self.run_prefixes is None
            and not self.operator
            and not self.processor
        ):
            return None
        machines = None if self.machines is None else frozenset(self.machines)
        return Scope(
            key_id, machines, self.run_prefixes, self.operator is True, self.processor is True
        )

    def refuses_at(self, key_id: str, at_ms: int) -> str | None:
        """Why this key proves nothing for a record appended at `at_ms`, or None."""
        if self.revoked_at_ms is not None and at_ms >= self.revoked_at_ms:
            return f"key id '{key_id}' was revoked at {self.revoked_at_ms}"
        if self.not_before_ms is not None and at_ms < self.not_before_ms:
            return f"key id '{key_id}' is valid from {self.not_before_ms}"
        if self.not_after_ms is not None and at_ms >= self.not_after_ms:
            return f"key id '{key_id}' expired at {self.not_after_ms}"
        return None


@lru_cache(maxsize=1024)
def _principal(source: str, authority: str) -> Principal:
    """One Principal per pair, built once (frozen, so shared safely): every proposal
    record is authenticated, and building and validating one each time was a hot spot."""
    return Principal(source=source, authority=authority)


#: How old a signature may be when its record is appended, and how far ahead of the
#: broker's clock a producer's clock may run.
DEFAULT_MAX_AGE_MS = 5 * 60 * 1000
DEFAULT_CLOCK_SKEW_MS = 30 * 1000


class Keyring(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    keys: dict[KeyId, KeyEntry]
    signature_max_age_ms: int = Field(default=DEFAULT_MAX_AGE_MS, ge=1)
    clock_skew_ms: int = Field(default=DEFAULT_CLOCK_SKEW_MS, ge=0)

    @property
    def has_ed25519(self) -> bool:
        return any(entry.public_key is not None for entry in self.keys.values())


class SigningKey(BaseModel):
    """A producer's key: what it signs with (never in a worker's keyring for ed25519)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key_id: KeyId
    algorithm: Algorithm = Algorithm.HMAC_SHA256
    secret: str | None = Field(default=None, min_length=16)
    private_key: HexKey | None = None

    @model_validator(mode="after")
    def _one_signer(self) -> Self:
        if (self.secret is None) == (self.private_key is None) or (
            (self.algorithm is Algorithm.ED25519) != (self.private_key is not None)
        ):
            raise ValueError("a signing key has a secret (hmac-sha256) or a private_key (ed25519)")
        return self

    @classmethod
    def hmac(cls, key_id: str, secret: str) -> "SigningKey":
        return cls(key_id=key_id, secret=secret)

    def sign(self, base: bytes) -> str:
        if self.private_key is not None:
            return ed25519_signature(self.private_key, base)
        assert self.secret is not None
        return hmac_signature(self.secret, base)

    def headers(self, topic: str, key: bytes | None, value: bytes, at_ms: int) -> RecordHeaders:
        """The headers that sign record (`key`, `value`) for `topic`, issued at `at_ms`."""
        signature = self.sign(signed_base(topic, key, value, self.key_id, at_ms))
        return [
            (HEADER_KEY_ID, self.key_id.encode()),
            (HEADER_SIGNED_AT, str(at_ms).encode()),
            (HEADER_SIGNATURE, signature.encode()),
        ]


class KeyringError(ValueError):
    pass


def parse_keyring(text: str, origin: str) -> Keyring:
    try:
        return Keyring.model_validate_json(text)
    except ValidationError as exc:
        refused = [e for e in exc.errors(include_url=False) if e["type"] == _REFUSED_KEY]
        if refused:
            raise KeyringError(_refused_keys(origin, refused)) from exc
        raise KeyringError(
            f"{origin} is not a keyring ({describe_errors(exc)}); expected "
            '{"keys": {"<key id>": {"algorithm": "ed25519", "public_key": "<hex>", '
            '"source": "...", "authority": "..."}}} (see `runstate keys --help`)'
        ) from exc


def _refused_keys(origin: str, errors: list[ErrorDetails]) -> str:
    """A keyring holding keys the strict rule refuses: which, why, and what to do."""
    keys = "; ".join(
        f"key id '{e['loc'][1]}' (public_key {e['input']}): {e['ctx']['why']}" for e in errors
    )
    return (
        f"{origin} holds Ed25519 public keys no verifier here accepts: {keys}. Remove "
        "each such key from the keyring (a key generated by `runstate keys add` or "
        "`runstate keys rotate` is always accepted), then load it again"
    )


def load_keyring(path: Path | None, text: str | None) -> Keyring:
    """From a file if given, else from JSON text; one of them is required."""
    if path is not None:
        try:
            return parse_keyring(path.read_text(encoding="utf-8"), str(path))
        except OSError as exc:
            raise KeyringError(f"cannot read keyring {path}: {exc.strerror}") from exc
    if text:
        return parse_keyring(text, "RUNSTATE_KEYRING")
    raise KeyringError(
        "no keyring: give --keyring-file (RUNSTATE_KEYRING_FILE) or RUNSTATE_KEYRING; "
        "`runstate keys generate` writes one"
    )


def load_signing_key(path: Path) -> SigningKey:
    try:
        return SigningKey.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise KeyringError(f"cannot read signing key {path}: {exc.strerror}") from exc
    except ValidationError as exc:
        raise KeyringError(
            f"{path} is not a signing key ({describe_errors(exc)}); expected "
            '{"key_id": "...", "algorithm": "ed25519", "private_key": "<hex>"} '
            "(`runstate keys add` writes one)"
        ) from exc


def signing_key_from(keyring: Keyring, key_id: str) -> SigningKey:
    """The signing key of an HMAC key in `keyring` (its secret signs too)."""
    entry = keyring.keys.get(key_id)
    if entry is None:
        raise KeyringError(
            f"no key '{key_id}' in the keyring; have: {', '.join(sorted(keyring.keys))}"
        )
    if entry.secret is None:
        raise KeyringError(
            f"key '{key_id}' is {entry.algorithm}: the keyring holds only its public key; "
            "sign with its private key file (--signing-key-file)"
        )
    return SigningKey.hmac(key_id, entry.secret)


def signing_keys(keyring: Keyring, private_dir: Path | None = None) -> dict[str, SigningKey]:
    """A signer for every key of `keyring`: an HMAC key signs with its own secret, an
    Ed25519 key with its private half from `<private_dir>/<key id>.key.json` (where
    `runstate keys generate` writes them)."""
    signers = {}
    for key_id, entry in keyring.keys.items():
        if entry.secret is not None:
            signers[key_id] = SigningKey.hmac(key_id, entry.secret)
        elif private_dir is None:
            raise KeyringError(
                f"key '{key_id}' is {entry.algorithm}: the keyring holds only its public "
                "key; give the directory of its private key files"
            )
        else:
            signers[key_id] = load_signing_key(private_dir / f"{key_id}.key.json")
    return signers


def dump_keyring(keyring: Keyring) -> str:
    return json.dumps(keyring.model_dump(mode="json", exclude_none=True), indent=2) + "\n"


def dump_signing_key(key: SigningKey) -> str:
    return json.dumps(key.model_dump(mode="json", exclude_none=True), indent=2) + "\n"


class KeyringWatch:
    """The keyring a worker decides with: the file's keyring, read again when the file
    changes (looked at no more than once per `interval_s`), so keys are added, rotated
    and revoked without a restart. A file that does not parse is logged and the keyring
    before it kept: a half-written edit must not lock every producer out."""

    def __init__(self, keyring: Keyring, path: Path | None, interval_s: float = 1.0) -> None:
        self._keyring = keyring
        self._path = path
        self._interval_s = interval_s
        self._next_look = 0.0
        self._seen = self._stamp()

    def current(self) -> Keyring:
        if self._path is None:
            return self._keyring
        now = time.monotonic()
        if now < self._next_look:
            return self._keyring
        self._next_look = now + self._interval_s
        stamp = self._stamp()
        if stamp != self._seen:
            self._seen = stamp
            try:
                self._keyring = load_keyring(self._path, None)
            except KeyringError as exc:
                log.error("keyring not reloaded, the one before is kept: %s", exc)
            else:
                log.info("keyring reloaded from %s: %d keys", self._path, len(self._keyring.keys))
        return self._keyring

    def _stamp(self) -> tuple[int, int] | None:
        try:
            stat = self._path.stat() if self._path is not None else None
        except OSError:
            return None
        return None if stat is None else (stat.st_mtime_ns, stat.st_size)
