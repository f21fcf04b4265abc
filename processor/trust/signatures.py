"""The signature on a proposal record: what is signed, how, and in which headers.

A producer signs the *signed base*, which binds the signature to one record on one
topic at one time (docs/wire.md gives it byte for byte):

    runstate-proposal-v1 LF topic LF key id LF signed-at LF hex(sha256(key)) LF hex(sha256(value))

`signed-at` is the producer's clock in milliseconds since the epoch, in decimal; a record
without a key hashes the empty string. The signature is lowercase hex: HMAC-SHA256 keyed
with the UTF-8 bytes of the shared secret, or Ed25519 over the base with the producer's
private key. Pure functions. Behind the strict rule of processor/trust/ed25519.py,
libsodium (PyNaCl, the worker extra) verifies Ed25519 where it is installed, at about half
the CPU of `cryptography` (OpenSSL), which verifies elsewhere and signs; under the strict
rule both accept exactly the same signatures (tests/unit/test_ed25519.py compares them).
`verify_ed25519` is the one Ed25519 verification every verifier here makes: the worker's
loop and its batch verifier, `runstate verify`.
"""

import hashlib
import hmac
from enum import StrEnum
from functools import lru_cache

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from processor.trust.ed25519 import public_key_problem_hex, signature_problem

try:
    from nacl.bindings import crypto_sign_open
    from nacl.exceptions import BadSignatureError

    HAVE_SODIUM = True
except ImportError:  # the light install: `cryptography` verifies
    HAVE_SODIUM = False

HEADER_KEY_ID = "runstate-key-id"
HEADER_SIGNED_AT = "runstate-signed-at"
HEADER_SIGNATURE = "runstate-signature"
BASE_PREFIX = b"runstate-proposal-v1"

RecordHeaders = list[tuple[str, str | bytes | None]]


class Algorithm(StrEnum):
    HMAC_SHA256 = "hmac-sha256"
    ED25519 = "ed25519"


def signed_base(
    topic: str, key: bytes | None, value: bytes, key_id: str, signed_at_ms: int
) -> bytes:
    """The bytes a signature covers. Topic and key id hold no line feed (both are
    identifiers); the record's key and value go in as hashes, so any bytes are safe."""
    return b"\n".join(
        (
            BASE_PREFIX,
            topic.encode(),
            key_id.encode(),
            str(signed_at_ms).encode(),
            hashlib.sha256(key or b"").hexdigest().encode(),
            hashlib.sha256(value).hexdigest().encode(),
        )
    )


def hmac_signature(secret: str, base: bytes) -> str:
    # A copy of an HMAC keyed once per secret: 1.2 us, against 2 us for hmac.digest,
    # and it keeps the GIL (hmac.digest lets it go around OpenSSL's call, and in a
    # worker whose other threads want it the loop then waited to get it back: 8.7 us
    # a call in a profile of a drain).
    mac = _keyed_hmac(secret).copy()
    mac.update(base)
    return mac.hexdigest()


@lru_cache(maxsize=1024)
def _keyed_hmac(secret: str) -> "hmac.HMAC":
    return hmac.new(secret.encode(), digestmod=hashlib.sha256)


def ed25519_signature(private_key_hex: str, base: bytes) -> str:
    return _private_key(private_key_hex).sign(base).hex()


def ed25519_public_key(private_key_hex: str) -> str:
    """The public half (hex) of a private key given as its 32-byte seed in hex."""
    return _private_key(private_key_hex).public_key().public_bytes_raw().hex()


def new_ed25519_private_key() -> str:
    return Ed25519PrivateKey.generate().private_bytes_raw().hex()


def verify_ed25519(public_key_hex: str, base: bytes, signature_hex: str) -> bool:
    """Does the signature verify over `base` under the strict rule (processor/trust/ed25519.py):
    a key of small or mixed order, or not canonical, verifies nothing; a signature with
    S >= L or a small-order R is refused; the rest is RFC 8032's equation, cofactorless."""
    # Not cached: a cache of verified (public key, signed base, signature) would be safe
    # (the base binds topic, key, value hash, key id and signing time) but a worker
    # decides each record once; only a replay or a redelivery after a crash sees one
    # again.
    try:
        signature = bytes.fromhex(signature_hex)
    except ValueError:
        return False
    if signature_problem(signature) is not None:
        return False
    if HAVE_SODIUM:
        return verify_ed25519_sodium(public_key_hex, base, signature)
    return verify_ed25519_openssl(public_key_hex, base, signature)


def verify_ed25519_sodium(public_key_hex: str, base: bytes, signature: bytes) -> bool:
    """`verify_ed25519` by libsodium, for a signature the strict rule's byte checks
    (`signature_problem`) already passed."""
    raw = _accepted_public_key(public_key_hex)
    if raw is None:
        return False
    try:
        crypto_sign_open(signature + base, raw)  # libsodium's crypto_sign_verify_detached
    except BadSignatureError:
        return False
    return True


def verify_ed25519_openssl(public_key_hex: str, base: bytes, signature: bytes) -> bool:
    """`verify_ed25519` by `cryptography`, for a signature the strict rule's byte checks
    (`signature_problem`) already passed."""
    public_key = _public_key(public_key_hex)
    if public_key is None:
        return False
    try:
        public_key.verify(signature, base)
    except InvalidSignature:
        return False
    return True


def verify_hmac(secret: str, base: bytes, signature_hex: str) -> bool:
    # As bytes: compare_digest refuses str with non-ASCII characters (a TypeError).
    return hmac.compare_digest(hmac_signature(secret, base).encode(), signature_hex.encode())


@lru_cache(maxsize=1024)
def _accepted_public_key(public_key_hex: str) -> bytes | None:
    """The key's bytes, or None when the strict rule refuses it."""
    if public_key_problem_hex(public_key_hex) is not None:
        return None
    return bytes.fromhex(public_key_hex)


@lru_cache(maxsize=1024)
def _public_key(public_key_hex: str) -> Ed25519PublicKey | None:
    """The key, or None when the strict rule refuses it (a keyring refuses it at load;
    this holds for any caller)."""
    if public_key_problem_hex(public_key_hex) is not None:
        return None
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key_hex))


@lru_cache(maxsize=64)
def _private_key(private_key_hex: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(private_key_hex))


def is_hex_key(text: str) -> bool:
    """32 bytes as 64 hex digits: an Ed25519 public key or private key seed."""
    try:
        return len(bytes.fromhex(text)) == 32 and len(text) == 64
    except ValueError:
        return False
