"""The tamper-evident chain of a run's transitions.

`hash` = hex SHA-256 of the UTF-8 bytes of this JSON array, no spaces, keys of the
objects sorted, non-ASCII kept (json.dumps(..., separators=(",", ":"), sort_keys=True,
ensure_ascii=False)):

    [schema_version, transition_id, run_id, machine, revision, from_state, to_state,
     event, proposal_id, principal.source, principal.authority, reason, payload,
     metadata, retry_count, at_ms, prev_hash]

`prev_hash` is the previous transition's `hash` ("" at revision 0), so changing any
record breaks its own hash and every later link.
"""

import hashlib
import json
from collections.abc import Callable
from json import encoder as _encoder
from typing import Any

encode_basestring: Callable[[str], str] = _encoder.encode_basestring
_slow = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False)
_c_make_encoder = getattr(_encoder, "c_make_encoder", None)
if _c_make_encoder is not None:
    # One C encoder for every call: JSONEncoder.encode builds a new one each time.
    _c_encode = _c_make_encoder(
        None, _slow.default, encode_basestring, None, ":", ",", True, False, True
    )

    def _encode_other(value: Any) -> str:
        return "".join(_c_encode(value, 0))

else:  # pragma: no cover - CPython always has the C encoder

    def _encode_other(value: Any) -> str:
        return _slow.encode(value)


def _json(value: Any) -> str:
    # The same text as json.dumps(..., separators, sort_keys, ensure_ascii=False) gives,
    # without building an encoder per value (the hash was the engine's largest cost).
    if value is None:
        return "null"
    kind = type(value)
    if kind is str:
        text: str = encode_basestring(value)
        return text
    if kind is int:
        return str(value)
    if kind is dict and not value:
        return "{}"
    return _encode_other(value)


def transition_hash(fields: dict[str, Any]) -> str:
    """The hash of a transition given as its field values (a model's __dict__ works)."""
    e = encode_basestring
    principal = fields["principal"]
    from_state, reason = fields["from_state"], fields["reason"]
    # Field types are fixed by the Transition model, so each is encoded directly; a
    # unit test checks this text equals canonical_text() of the same values.
    text = (
        f"[{fields['schema_version']:d},{e(fields['transition_id'])},{e(fields['run_id'])},"
        f"{e(fields['machine'])},{fields['revision']:d},"
        f"{'null' if from_state is None else e(from_state)},{e(fields['to_state'])},"
        f"{e(fields['event'])},{e(fields['proposal_id'])},{e(principal.source)},"
        f"{e(principal.authority)},{'null' if reason is None else e(reason)},"
        f"{_json(fields['payload'])},{_json(fields['metadata'])},{fields['retry_count']:d},"
        f"{fields['at_ms']:d},{e(fields['prev_hash'])}]"
    )
    return hashlib.sha256(text.encode()).hexdigest()


def canonical_values(fields: dict[str, Any]) -> list[Any]:
    principal = fields["principal"]
    return [
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


def canonical_text(values: list[Any]) -> str:
    """The reference definition of the hashed text (slow; tests check the fast path)."""
    return json.dumps(values, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
