"""A proposal's JSON read without building it through validation, for the values that
are plainly valid: the common record, decoded at about two thirds of the model's cost.

`plain_proposal` parses with orjson and checks, by hand, exactly what the `Proposal`
model checks; it answers only when every check passes, and the proposal it returns
equals the model's (a property test compares both on generated and hostile values).
Anything else, however slightly off (a field of another type, an unknown field, a
number orjson reads differently), is left to the model, whose refusal says why.

orjson and the model's parser agree on JSON's grammar, on duplicate keys (the last
wins) and on strings (a lone surrogate is refused by both). They differ on numbers
beyond 64 bits, which orjson reads as floats: a float of that size sends the value to
the model, which keeps such integers exact (and refuses them where they may not be).
"""

from typing import Any

import orjson

from schemas.base import OLDEST_SCHEMA_VERSION, SCHEMA_VERSION
from schemas.identifiers import is_name, is_proposal_id, is_run_id
from schemas.ijson import MAX_DEPTH, MAX_EXACT_INTEGER
from schemas.messages import Proposal

_REASON_CHARS = 256
_FIELDS = frozenset(Proposal.model_fields)
#: orjson reads an integer beyond 64 bits as a float: one this large may have been one.
_FLOAT_AT_MOST = float(2**63)
_INT = int


def plain_proposal(value: bytes) -> Proposal | None:
    """The proposal `value` holds when it is plainly valid, else None (the model
    decides: it may still accept it, or refuse it and say why)."""
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if type(data) is not dict or not _FIELDS.issuperset(data):
        return None
    get = data.get
    version = get("schema_version", SCHEMA_VERSION)
    if type(version) is not _INT or not OLDEST_SCHEMA_VERSION <= version <= SCHEMA_VERSION:
        return None
    proposal_id, run_id, event = get("proposal_id"), get("run_id"), get("event")
    if not (is_proposal_id(proposal_id) and is_run_id(run_id) and is_name(event)):
        return None
    expected = get("expected_revision")
    if expected is not None and (type(expected) is not _INT or expected < 0):
        return None
    reason = get("reason")
    if reason is not None and (type(reason) is not str or not 0 < len(reason) <= _REASON_CHARS):
        return None
    payload, metadata = get("payload", {}), get("metadata", {})  # absent: {}; null: refused
    if not (_plain_object(payload, MAX_DEPTH) and _plain_object(metadata, MAX_DEPTH)):
        return None
    return Proposal.trusted(
        {
            "schema_version": version,
            "proposal_id": proposal_id,
            "run_id": run_id,
            "event": event,
            "expected_revision": expected,
            "reason": reason,
            "payload": payload,
            "metadata": metadata,
        }
    )


def _plain_object(value: object, room: int) -> bool:
    """An object the model takes as is: string keys, its integers within
    ±MAX_EXACT_INTEGER, floats finite and small enough to have been floats in the JSON,
    nested at most `room` levels."""
    return type(value) is dict and _plain(value, room)


def _plain(value: Any, room: int) -> bool:
    kind = type(value)
    if kind is dict:
        if room <= 0:
            return False
        items = value.values()
    elif kind is list:
        if room <= 0:
            return False
        items = value
    elif kind is _INT:
        return bool(-MAX_EXACT_INTEGER <= value <= MAX_EXACT_INTEGER)
    elif kind is float:
        return bool(-_FLOAT_AT_MOST < value < _FLOAT_AT_MOST)  # NaN, infinities fail too
    else:
        return kind is str or kind is bool or value is None
    # The items' scalars inline: a call per value doubles the walk.
    for item in items:
        kind = type(item)
        if kind is str or item is None or kind is bool:
            continue
        if kind is _INT:
            if -MAX_EXACT_INTEGER <= item <= MAX_EXACT_INTEGER:
                continue
            return False
        if kind is float:
            if -_FLOAT_AT_MOST < item < _FLOAT_AT_MOST:
                continue
            return False
        if not _plain(item, room - 1):
            return False
    return True
