"""Before `decide`: turn a record's bytes and headers into a proposal and a principal.

Pure functions over bytes (no Kafka): the runtime calls them per record; tests call
them directly. Order: a timestamp not the broker's -> DLQ, undecodable -> DLQ,
schema_invalid, unauthenticated, stale_signature.
"""

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from pydantic import ValidationError

from processor.engine.scope import Scope
from processor.trust.keyring import Keyring
from processor.trust.signatures import (
    HEADER_KEY_ID,
    HEADER_SIGNATURE,
    HEADER_SIGNED_AT,
    signed_base,
    verify_ed25519,
    verify_hmac,
)
from schemas.base import describe_errors
from schemas.codes import RejectionCode
from schemas.identifiers import is_name, is_proposal_id, is_run_id
from schemas.messages import Principal, Proposal, Rejection
from schemas.proposal_json import plain_proposal

#: Default limit on a proposal record's value: 64 KiB (`--max-proposal-bytes` sets another).
DEFAULT_MAX_PROPOSAL_BYTES = 64 * 1024

Headers = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None


class TimestampType(Enum):
    """Who set a record's timestamp: the broker when it appended the record (the
    topic's message.timestamp.type=LogAppendTime), the producer (CreateTime), or nobody."""

    LOG_APPEND_TIME = "LogAppendTime"
    CREATE_TIME = "CreateTime"
    NOT_AVAILABLE = "not available"

    @classmethod
    def of_librdkafka(cls, code: int | None) -> "TimestampType":
        """confluent-kafka's `Message.timestamp()[0]` (TIMESTAMP_NOT_AVAILABLE 0,
        TIMESTAMP_CREATE_TIME 1, TIMESTAMP_LOG_APPEND_TIME 2); anything else: not available."""
        return _LIBRDKAFKA_TYPES.get(code, cls.NOT_AVAILABLE)

    @classmethod
    def of_kafka(cls, code: int | None) -> "TimestampType":
        """Kafka's own numbering, aiokafka's and so Faust's `Message.timestamp_type`
        (CreateTime 0, LogAppendTime 1, -1 or None for none)."""
        return _KAFKA_TYPES.get(code, cls.NOT_AVAILABLE)


_LIBRDKAFKA_TYPES: dict[int | None, TimestampType] = {
    1: TimestampType.CREATE_TIME,
    2: TimestampType.LOG_APPEND_TIME,
}
_KAFKA_TYPES: dict[int | None, TimestampType] = {
    0: TimestampType.CREATE_TIME,
    1: TimestampType.LOG_APPEND_TIME,
}


def untrusted_time(timestamp_type: TimestampType, topic: str) -> str | None:
    """Why a record's timestamp cannot be the time it is decided at (None: it can).

    Signature freshness, key validity and every deadline are judged by the record's
    timestamp: only the broker's (LogAppendTime) is not the producer's to choose. A
    record stamped by its producer (the topic switched to CreateTime) could pass a stale
    signature as fresh or dodge a deadline, so it is not decided at all."""
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        return None
    return (
        f"the record's timestamp type is {timestamp_type.value}, not LogAppendTime: its "
        "time is not the broker's, and signature freshness and deadlines are judged by "
        f"it, so it was not decided; set message.timestamp.type=LogAppendTime on topic "
        f"'{topic}' (`runstate topics describe` checks it), then send the proposal again, "
        "signed anew"
    )


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Not a proposal at all (not JSON, not an object): goes to the DLQ with `reason`."""

    reason: str


def header_value(headers: Headers, name: str) -> bytes | str | None:
    """The first value of header `name` (a record's headers as a list or a mapping)."""
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    for key, raw in items:
        if key == name and raw is not None:
            return raw
    return None


def _header(headers: Headers, name: str) -> str | None:
    return _text(header_value(headers, name))


@dataclass(frozen=True, slots=True)
class Credential:
    """What a valid signature proves: who (the principal), over which runs (scope), and
    when it was signed (milliseconds since the epoch; None where no signature is)."""

    principal: Principal
    scope: Scope | None
    signed_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Unproven:
    """Why a record proves no principal: `unauthenticated` or `stale_signature`."""

    code: RejectionCode
    why: str


#: Ed25519 verifications already made: (public key hex, signed base, signature hex) ->
#: whether it verifies (see `ed25519_claim`).
Verified = Mapping[tuple[str, bytes, str], bool]


def authenticate(
    topic: str,
    key: bytes | None,
    value: bytes,
    headers: Headers,
    keyring: Keyring,
    appended_at_ms: int,
    verified: Verified | None = None,
) -> Credential | Unproven:
    """The credential a record's signature proves, or why there is none. `verified`:
    Ed25519 verifications made beforehand (the same answers, made elsewhere).

    Checked in order: the three headers are there, the key id is in the keyring, the
    signature verifies over the signed base, the key is valid when the record was
    appended (not before its validity, not expired, not revoked), and the signature is
    fresh (signed at most the keyring's max age before the record was appended, at most
    its clock skew after)."""
    found = _signature_headers(headers)
    if isinstance(found, str):
        return Unproven(
            RejectionCode.UNAUTHENTICATED,
            f"header {found} appears more than once: which one is signed is ambiguous",
        )
    key_id, signed_at, signature = found
    if key_id is None or signature is None:
        return Unproven(
            RejectionCode.UNAUTHENTICATED,
            f"record is not signed (headers {HEADER_KEY_ID}, {HEADER_SIGNED_AT} and "
            f"{HEADER_SIGNATURE})",
        )
    if signed_at is None:
        return Unproven(
            RejectionCode.UNAUTHENTICATED,
            f"record has no {HEADER_SIGNED_AT} header: a signature covers the topic, the "
            "record key, the value, the key id and the time it was made (docs/wire.md)",
        )
    entry = keyring.keys.get(key_id)
    if entry is None:
        return Unproven(RejectionCode.UNAUTHENTICATED, f"unknown key id '{key_id}'")
    signed_at_ms = int(signed_at) if _DECIMAL.fullmatch(signed_at) else None
    if signed_at_ms is None:
        return Unproven(
            RejectionCode.UNAUTHENTICATED,
            f"{HEADER_SIGNED_AT} is '{signed_at[:40]}', not milliseconds since the epoch",
        )
    base = signed_base(topic, key, value, key_id, signed_at_ms)
    if not _LOWER_HEX.fullmatch(signature):
        return Unproven(
            RejectionCode.UNAUTHENTICATED,
            f"{HEADER_SIGNATURE} of key id '{key_id}' is not lowercase hex",
        )
    if entry.public_key is not None:
        known = None if verified is None else verified.get((entry.public_key, base, signature))
        valid = verify_ed25519(entry.public_key, base, signature) if known is None else known
    else:
        assert entry.secret is not None
        valid = verify_hmac(entry.secret, base, signature)
    if not valid:
        return Unproven(
            RejectionCode.UNAUTHENTICATED,
            f"bad signature for key id '{key_id}' (over topic '{topic}', this key and value)",
        )
    refused = entry.refuses_at(key_id, appended_at_ms)
    if refused is not None:
        return Unproven(
            RejectionCode.UNAUTHENTICATED, f"{refused}; the record is of {appended_at_ms}"
        )
    age = appended_at_ms - signed_at_ms
    if age > keyring.signature_max_age_ms or -age > keyring.clock_skew_ms:
        when = (
            f"{age} ms before it was appended; the limit is {keyring.signature_max_age_ms}"
            if age > 0
            else f"{-age} ms after it was appended (the producer's clock is ahead); the "
            f"allowed clock skew is {keyring.clock_skew_ms}"
        )
        return Unproven(
            RejectionCode.STALE_SIGNATURE,
            f"signed at {signed_at_ms}, {when}: sign again when you send (a signature is "
            "good for one sending)",
        )
    return Credential(entry.principal, entry.scope(key_id), signed_at_ms)


def ed25519_claim(
    topic: str, key: bytes | None, value: bytes | None, headers: Headers, keyring: Keyring
) -> tuple[str, bytes, str] | None:
    """What verifying a record's Ed25519 signature takes, (public key hex, signed base,
    signature hex), when its headers name an Ed25519 key of `keyring` in the form
    `authenticate` accepts; else None. Verifications are the slow part of authenticating
    (about 80 us, HMAC 1.2), so a runtime may make a batch's beforehand, in parallel, and
    hand the answers to `authenticate`."""
    found = _signature_headers(headers)
    if isinstance(found, str) or value is None:
        return None
    key_id, signed_at, signature = found
    if key_id is None or signed_at is None or signature is None:
        return None
    entry = keyring.keys.get(key_id)
    if entry is None or entry.public_key is None:
        return None
    if not (_DECIMAL.fullmatch(signed_at) and _LOWER_HEX.fullmatch(signature)):
        return None
    return entry.public_key, signed_base(topic, key, value, key_id, int(signed_at)), signature


#: An issue time: milliseconds since the epoch, at most 16 digits (year 318857), no
#: leading zero (the signed base holds the number: one spelling per time).
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,15}")
_LOWER_HEX = re.compile(r"[0-9a-f]{1,256}")
_SIGNATURE_HEADERS = (HEADER_KEY_ID, HEADER_SIGNED_AT, HEADER_SIGNATURE)


_SIGNATURE_INDEX = {name: i for i, name in enumerate(_SIGNATURE_HEADERS)}


def _signature_headers(headers: Headers) -> tuple[str | None, str | None, str | None] | str:
    """The key id, signed-at and signature headers (the first value of each that is
    not None, as text), or the name of the first of them that appears more than once.
    One pass over a record's headers: three scans per header each were a hot spot."""
    if headers is None or isinstance(headers, Mapping):  # a mapping repeats nothing
        key_id, signed_at, signature = (_header(headers, n) for n in _SIGNATURE_HEADERS)
        return key_id, signed_at, signature
    # The common record repeats no header name: one dict of them, built in C, answers.
    named = dict(headers)
    if len(named) == len(headers):
        get = named.get
        return _text(get(HEADER_KEY_ID)), _text(get(HEADER_SIGNED_AT)), _text(get(HEADER_SIGNATURE))
    counts = [0, 0, 0]
    values: list[bytes | str | None] = [None, None, None]
    index = _SIGNATURE_INDEX.get
    for name, raw in headers:
        i = index(name)
        if i is not None:
            counts[i] += 1
            if values[i] is None:
                values[i] = raw
    for i, count in enumerate(counts):
        if count > 1:
            return _SIGNATURE_HEADERS[i]
    return _text(values[0]), _text(values[1]), _text(values[2])


def _text(raw: bytes | str | None) -> str | None:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def decode_proposal(
    value: bytes | None, now_ms: int, max_bytes: int = DEFAULT_MAX_PROPOSAL_BYTES
) -> Proposal | Rejection | Undecodable:
    """Parse and strictly validate a record value."""
    if value is None:
        return Undecodable("record has no value (tombstone)")
    invalid: ValidationError | None = None
    if len(value) <= max_bytes:
        # The common case parses once; only a refused value is parsed again, to say why.
        # (Numbers that are not finite, too deep or inexact are the model's to refuse:
        # `schemas.ijson`, one walk.)
        plain = plain_proposal(value)  # the common record, without the model's validation
        if plain is not None:
            return plain
        try:
            return Proposal.model_validate_json(value)
        except ValidationError as exc:
            invalid = exc
    try:
        # Strict UTF-8 first: json.loads(bytes) would let raw surrogate bytes through.
        data = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Undecodable(f"value is not UTF-8 JSON: {exc}")
    except RecursionError:  # hostile input: e.g. 50,000 nested arrays
        return Undecodable("value is JSON nested too deeply to decode")
    except ValueError:  # Python converts no integer of over 4,300 digits (a DoS guard)
        return Undecodable("value is JSON with an integer too long to decode (4,300 digits)")
    if not isinstance(data, dict):
        return Undecodable(f"value is JSON {type(data).__name__}, not an object")

    def refuse(detail: str) -> Rejection:
        # Echo only what is a valid identifier: anything else (a lone surrogate, a
        # control character, 60 KB of text) could not be a key or even be encoded.
        run_id, proposal_id, event = data.get("run_id"), data.get("proposal_id"), data.get("event")
        return Rejection(
            code=RejectionCode.SCHEMA_INVALID,
            detail=detail,
            run_id=run_id if is_run_id(run_id) else None,
            proposal_id=proposal_id if is_proposal_id(proposal_id) else None,
            event=event if is_name(event) else None,
            at_ms=now_ms,
        )

    if invalid is None:
        return refuse(f"proposal is {len(value)} bytes; the limit is {max_bytes}")
    return refuse(describe_errors(invalid))


def reject_unproven(proposal: Proposal, unproven: Unproven, now_ms: int) -> Rejection:
    return Rejection(
        code=unproven.code,
        detail=f"{unproven.why}; sign proposals with a key from the worker's keyring"
        if unproven.code is RejectionCode.UNAUTHENTICATED
        else unproven.why,
        run_id=proposal.run_id,
        proposal_id=proposal.proposal_id,
        event=proposal.event,
        at_ms=now_ms,
    )
