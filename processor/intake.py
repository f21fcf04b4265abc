"""Before `decide`: turn a record's bytes and headers into a proposal and a principal.

Pure functions over bytes (no Kafka): the runtime calls them per record; tests call
them directly. Order: undecodable -> DLQ, schema_invalid, unauthenticated.
"""

import hashlib
import hmac
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from processor.keyring import Keyring
from schemas.base import describe_errors
from schemas.codes import RejectionCode
from schemas.identifiers import is_name, is_proposal_id, is_run_id
from schemas.messages import Principal, Proposal, Rejection

#: Default limit on a proposal record's value (DESIGN: 64 KiB, configurable).
DEFAULT_MAX_PROPOSAL_BYTES = 64 * 1024
HEADER_KEY_ID = "runstate-key-id"
HEADER_SIGNATURE = "runstate-signature"

Headers = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Not a proposal at all (not JSON, not an object): goes to the DLQ with `reason`."""

    reason: str


def sign(value: bytes, secret: str) -> str:
    return hmac.new(secret.encode(), value, hashlib.sha256).hexdigest()


def signed_headers(value: bytes, key_id: str, secret: str) -> list[tuple[str, str | bytes | None]]:
    return [(HEADER_KEY_ID, key_id.encode()), (HEADER_SIGNATURE, sign(value, secret).encode())]


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
    raw = header_value(headers, name)
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def authenticate(value: bytes, headers: Headers, keyring: Keyring) -> Principal | str:
    """The principal a valid signature proves, or why there is none."""
    key_id = _header(headers, HEADER_KEY_ID)
    signature = _header(headers, HEADER_SIGNATURE)
    if key_id is None or signature is None:
        return f"record is not signed (headers {HEADER_KEY_ID} and {HEADER_SIGNATURE})"
    entry = keyring.keys.get(key_id)
    if entry is None:
        return f"unknown key id '{key_id}'"
    # As bytes: compare_digest refuses str with non-ASCII characters (a TypeError).
    if not hmac.compare_digest(sign(value, entry.secret).encode(), signature.encode()):
        return f"bad signature for key id '{key_id}'"
    return Principal(source=entry.source, authority=entry.authority)


def decode_proposal(
    value: bytes | None, now_ms: int, max_bytes: int = DEFAULT_MAX_PROPOSAL_BYTES
) -> Proposal | Rejection | Undecodable:
    """Parse and strictly validate a record value."""
    if value is None:
        return Undecodable("record has no value (tombstone)")
    invalid: ValidationError | None = None
    not_finite = False
    if len(value) <= max_bytes:
        # The common case parses once; only a refused value is parsed again, to say why.
        try:
            proposal = Proposal.model_validate_json(value)
        except ValidationError as exc:
            invalid = exc
        else:
            if _MAYBE_NOT_FINITE.search(value) is None or (
                _finite(proposal.payload) and _finite(proposal.metadata)
            ):
                return proposal
            not_finite = True
    try:
        # Strict UTF-8 first: json.loads(bytes) would let raw surrogate bytes through.
        data = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Undecodable(f"value is not UTF-8 JSON: {exc}")
    except RecursionError:  # found by the fault harness: 50,000 nested arrays
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

    if not_finite:
        return refuse(
            "payload and metadata numbers must be finite: NaN, Infinity and numbers too "
            "large for a double are not JSON, and would be published as null"
        )
    if invalid is None:
        return refuse(f"proposal is {len(value)} bytes; the limit is {max_bytes}")
    return refuse(describe_errors(invalid))


# What a JSON number that is not finite looks like (the parser accepts NaN and Infinity,
# and a huge exponent or mantissa overflows to infinity); only then is the value walked.
_MAYBE_NOT_FINITE = re.compile(rb"NaN|Infinity|[eE]\+?[0-9]{3}|[0-9]{300}")


def _finite(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def reject_unauthenticated(proposal: Proposal, why: str, now_ms: int) -> Rejection:
    return Rejection(
        code=RejectionCode.UNAUTHENTICATED,
        detail=f"{why}; sign proposals with a key from the worker's keyring",
        run_id=proposal.run_id,
        proposal_id=proposal.proposal_id,
        event=proposal.event,
        at_ms=now_ms,
    )
