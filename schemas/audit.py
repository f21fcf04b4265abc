"""The tamper-evident chain of a run's transitions.

`hash` = hex SHA-256 of this JSON array in its RFC 8785 form (JSON Canonicalization
Scheme: UTF-8, no whitespace, object keys sorted by their UTF-16 code units, numbers as
ECMAScript writes them, `1` not `1.0`, `1e-7` not `1e-07`; only `"`, `\\` and control
characters escaped), so a JCS library in any language recomputes it:

    [schema_version, transition_id, run_id, machine, revision, from_state, to_state,
     event, proposal_id, principal.source, principal.authority, reason, payload,
     metadata, retry_count, at_ms, prev_hash]

followed, when the transition has either, by an object of `machine_version` and
`heartbeat_at_ms`, each only when set (a transition without them hashes as if the fields
did not exist).

`prev_hash` is the previous transition's `hash` ("" at revision 0), so changing any
record breaks its own hash and every later link.

A value RFC 8785 has no form for (a number that is not finite, an integer beyond
±(2**53-1), a lone surrogate) has no hash: ValueError. Proposals carrying one are
refused before they are decided.
"""

import hashlib
from typing import Any

import orjson
import rfc8785

from schemas.ijson import MAX_EXACT_INTEGER

#: orjson refuses what it would otherwise write differently from RFC 8785 among a
#: transition's typed fields: an integer beyond ±(2**53-1), a subclass of a builtin type.
_EXACT = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER | orjson.OPT_PASSTHROUGH_SUBCLASS


def _fast(values: list[Any]) -> bytes:
    """orjson's compact JSON of `values`, keys sorted by code point: RFC 8785's bytes
    whenever `_plain(values)` holds and orjson does not refuse them (tests compare the
    two). It writes a commit's hashed array in about 0.3 µs, where the json module's C
    encoder took 3.6."""
    return orjson.dumps(values, option=_EXACT)


def _plain(value: Any) -> bool:
    """Whether orjson (`_fast`) writes `value` exactly as RFC 8785 does. They differ in:

    - floats: orjson's shortest repr (`1.0`, `1e16`, `-0.0`, `1e21`) against
      ECMAScript's (`1`, `10000000000000000`, `0`, `1e+21`);
    - integers beyond ±(2**53-1): written by one, refused by the other;
    - key order: by code point against by UTF-16 code unit, which differ only when a
      key holds a character above U+FFFF (its surrogates sort below U+E000..U+FFFF);
    - other types (tuples, subclasses of str or int), left to rfc8785.

    Strings are written alike: `"` and `\\` escaped, `\\b \\f \\n \\r \\t` by name and the
    other C0 controls as lowercase `\\u00xx`, everything else as it is (DEL, U+2028,
    U+2029, non-ASCII); a lone surrogate fails both.
    """
    kind = type(value)
    if kind is dict:
        for key in value:
            if type(key) is not str or not (key.isascii() or max(key) <= "\uffff"):
                return False
        items = value.values()
    elif kind is list:
        items = value
    elif kind is int:
        return bool(-MAX_EXACT_INTEGER <= value <= MAX_EXACT_INTEGER)
    else:
        return kind is str or kind is bool or value is None
    # The items' scalars inline: this runs at every commit, and a call per value made it
    # half as slow again.
    for item in items:
        kind = type(item)
        if kind is str or item is None:
            continue
        if kind is int and -MAX_EXACT_INTEGER <= item <= MAX_EXACT_INTEGER:
            continue
        if kind is int or not _plain(item):
            return False
    return True


def _canonical(values: list[Any]) -> bytes:
    """The RFC 8785 bytes of `values`: through orjson when that provably writes the
    same (the common case, and many times faster, check included), else by the rfc8785
    package."""
    return _exact(values) if _plain(values) else rfc8785.dumps(values)


def _exact(values: list[Any]) -> bytes:
    """orjson's bytes of `values`, which hold nothing orjson writes differently from RFC
    8785 but integers and subclasses (`_EXACT` makes orjson refuse those), else
    rfc8785's."""
    try:
        return _fast(values)
    except orjson.JSONEncodeError:  # a lone surrogate, deep nesting, the above: rfc8785 decides
        return rfc8785.dumps(values)


def transition_hash(fields: dict[str, Any]) -> str:
    """The hash of a transition given as its field values, typed as `Transition` types
    them (a model's __dict__ works); ValueError when a value has no RFC 8785 form.

    Only `payload` and `metadata` can hold any JSON: the other fields are strings,
    integers and None, which orjson writes as RFC 8785 does or refuses (`_EXACT`), so
    the check for floats and astral keys walks those two alone (walking all the
    hashed values was a fifth of a commit's decision)."""
    values = canonical_values(fields)
    plain = _plain(fields["payload"]) and _plain(fields["metadata"])
    return hashlib.sha256(_exact(values) if plain else rfc8785.dumps(values)).hexdigest()


def canonical_values(fields: dict[str, Any]) -> list[Any]:
    principal = fields["principal"]
    values = [
        fields["schema_version"],
        fields["transition_id"],
        fields["run_id"],
        fields["machine"],
        fields["revision"],
        fields["from_state"],
        fields["to_state"],
        fields["event"],
        fields["proposal_id"],
        principal.source,
        principal.authority,
        fields["reason"],
        fields["payload"],
        fields["metadata"],
        fields["retry_count"],
        fields["at_ms"],
        fields["prev_hash"],
    ]
    # Written out rather than as a comprehension over the two names: this runs at
    # every commit.
    version, heartbeat = fields.get("machine_version"), fields.get("heartbeat_at_ms")
    if version is not None or heartbeat is not None:
        later = {}
        if version is not None:
            later["machine_version"] = version
        if heartbeat is not None:
            later["heartbeat_at_ms"] = heartbeat
        values.append(later)
    return values


def canonical_text(values: list[Any]) -> str:
    """The reference definition of the hashed text: RFC 8785, as the rfc8785 package
    writes it (slow; tests check the fast path against it)."""
    return rfc8785.dumps(values).decode()


def json_digest(value: Any) -> str:
    """Hex SHA-256 of the RFC 8785 form of `value`."""
    return hashlib.sha256(_canonical([value])).hexdigest()


def proposal_digest(
    event: str,
    reason: str | None,
    payload: dict[str, Any],
    metadata: dict[str, Any],
    source: str,
    authority: str,
) -> str:
    """What a proposal asks, and who asks it, as one value: hex SHA-256 of the RFC 8785
    form of `[event, reason, payload, metadata, source, authority]`. Two sendings of one
    proposal id are the same proposal when their digests are equal; a committed
    proposal's digest is recomputed from its transition, which holds all six. Neither
    the expected revision nor the signature is part of it (a resend may sign again)."""
    values = [event, reason, payload, metadata, source, authority]
    return hashlib.sha256(_canonical(values)).hexdigest()
