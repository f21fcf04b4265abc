"""Transitions and rejections as flat, typed rows: the columns of `runstate export`.

One row per record; nested fields become columns (`principal` -> `principal_source`,
`principal_authority`), free-form JSON (`payload`, `metadata`, a duplicate step's
result) stays JSON, as a string column, for the query engine's JSON functions. Every
row carries the record's `partition` and `offset`: where it came from, unique per topic.
"""

import json
from typing import Any

from schemas.messages import Rejection, Transition

#: column -> Arrow type name (pyarrow.<name>()), in file order
TRANSITION_COLUMNS: dict[str, str] = {
    "run_id": "string",
    "transition_id": "string",
    "machine": "string",
    "machine_version": "string",
    "revision": "int64",
    "from_state": "string",
    "to_state": "string",
    "event": "string",
    "proposal_id": "string",
    "principal_source": "string",
    "principal_authority": "string",
    "reason": "string",
    "retry_count": "int64",
    "at_ms": "int64",
    "payload": "string",
    "metadata": "string",
    "partition": "int32",
    "offset": "int64",
}

REJECTION_COLUMNS: dict[str, str] = {
    "code": "string",
    "detail": "string",
    "run_id": "string",
    "proposal_id": "string",
    "event": "string",
    "principal_source": "string",
    "principal_authority": "string",
    "state": "string",
    "revision": "int64",
    "original_transition_id": "string",
    "step_result": "string",
    "at_ms": "int64",
    "partition": "int32",
    "offset": "int64",
}


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def transition_row(partition: int, offset: int, t: Transition) -> dict[str, Any]:
    return {
        "run_id": t.run_id,
        "transition_id": t.transition_id,
        "machine": t.machine,
        "machine_version": t.machine_version,
        "revision": t.revision,
        "from_state": t.from_state,
        "to_state": t.to_state,
        "event": t.event,
        "proposal_id": t.proposal_id,
        "principal_source": t.principal.source,
        "principal_authority": t.principal.authority,
        "reason": t.reason,
        "retry_count": t.retry_count,
        "at_ms": t.at_ms,
        "payload": _json(t.payload),
        "metadata": _json(t.metadata),
        "partition": partition,
        "offset": offset,
    }


def rejection_row(partition: int, offset: int, r: Rejection) -> dict[str, Any]:
    principal = r.principal
    return {
        "code": r.code.value,
        "detail": r.detail,
        "run_id": r.run_id,
        "proposal_id": r.proposal_id,
        "event": r.event,
        "principal_source": None if principal is None else principal.source,
        "principal_authority": None if principal is None else principal.authority,
        "state": r.state,
        "revision": r.revision,
        "original_transition_id": r.original_transition_id,
        # None when the rejection has none (only duplicate_step carries a result).
        "step_result": None if r.step_result is None else _json(r.step_result),
        "at_ms": r.at_ms,
        "partition": partition,
        "offset": offset,
    }
