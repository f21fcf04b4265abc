"""The tamper-evident chain of a run's transitions.

`hash` = hex SHA-256 of the UTF-8 bytes of this JSON array, no spaces, keys of the
objects sorted, non-ASCII kept (json.dumps(..., separators=(",", ":"), sort_keys=True,
ensure_ascii=False)):

    [schema_version, transition_id, run_id, machine, revision, from_state, to_state,
     event, proposal_id, principal.source, principal.authority, reason, payload,
     metadata, retry_count, at_ms, prev_hash]

followed, when the transition has either, by an object of `machine_version` and
`heartbeat_at_ms`, each only when set (a transition without them hashes as if the fields
did not exist).

`prev_hash` is the previous transition's `hash` ("" at revision 0), so changing any
record breaks its own hash and every later link.
"""

import hashlib
import json
from json import encoder as _encoder
from typing import Any

_slow = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False)
_c_make_encoder = getattr(_encoder, "c_make_encoder", None)
if _c_make_encoder is not None:
    # One C encoder for every call (JSONEncoder.encode builds a new one each time):
    # the same text as json.dumps(..., separators, sort_keys, ensure_ascii=False).
    _c_encode = _c_make_encoder(
        None, _slow.default, _encoder.encode_basestring, None, ":", ",", True, False, True
    )

    def _canonical(values: list[Any]) -> str:
        return "".join(_c_encode(values, 0))

else:  # pragma: no cover - CPython always has the C encoder

    def _canonical(values: list[Any]) -> str:
        return _slow.encode(values)


def transition_hash(fields: dict[str, Any]) -> str:
    """The hash of a transition given as its field values (a model's __dict__ works)."""
    return hashlib.sha256(_canonical(canonical_values(fields)).encode()).hexdigest()


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
    later = {
        name: fields[name]
        for name in ("machine_version", "heartbeat_at_ms")
        if fields.get(name) is not None
    }
    if later:
        values.append(later)
    return values


def canonical_text(values: list[Any]) -> str:
    """The reference definition of the hashed text (slow; tests check the fast path)."""
    return json.dumps(values, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
