"""What a LangGraph thread's checkpoints look like as a run's `checkpoint` proposals, and
the thread read back from the run's history: pure, no I/O (the saver in `langgraph.py`
sends and reads them).

Each `put` and each `put_writes` is one record under the `langgraph` key of a
`checkpoint` proposal's data. Serialised values (the saver's serde: a type tag and
bytes) travel base64. A record whose JSON would not fit a run's checkpoint (64 KiB of
canonical JSON) is sent as parts first (each its own proposal, base64 of a slice of the
record's JSON), then a small record that names them and the SHA-256 of the whole.

Proposal ids are derived from what a record is (thread namespace, checkpoint id, task,
part), so a `put` repeated after a crash is answered with the transition it already
committed instead of being recorded twice.
"""

import base64
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from processor.engine.checkpoint import CHECKPOINT_MAX_BYTES

#: The data key of every record; a transition without it is not the saver's.
KEY = "langgraph"
#: A record is sent whole when its JSON is at most this many bytes (the run's checkpoint
#: limit with room for the `{"langgraph": ...}` wrapper); else in parts.
WHOLE_MAX_BYTES = CHECKPOINT_MAX_BYTES - 1024
#: The bytes of a record's JSON each part carries (base64 makes it 4/3 as long).
PART_BYTES = 36 * 1024

Typed = tuple[str, bytes]
#: LangGraph's special writes (error, scheduled, interrupt, resume) and their fixed
#: indexes: a later one replaces an earlier one; a regular write is kept as first written.
Special = dict[str, int]


def typed_json(value: Typed) -> list[str]:
    return [value[0], base64.b64encode(value[1]).decode("ascii")]


def typed_value(value: Any) -> Typed:
    kind, text = value
    if not isinstance(kind, str) or not isinstance(text, str):
        raise TypeError("a typed value is [type, base64]")
    return kind, base64.b64decode(text, validate=True)


def proposal_id(*parts: str) -> str:
    """A proposal id for a record made of `parts` (the same parts, the same id)."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()
    return f"langgraph:{digest[:40]}"


def checkpoint_record(
    ns: str, checkpoint_id: str, parent_id: str | None, checkpoint: Typed, metadata: Typed
) -> tuple[str, dict[str, Any]]:
    record = {
        "kind": "checkpoint",
        "ns": ns,
        "id": checkpoint_id,
        "parent": parent_id,
        "checkpoint": typed_json(checkpoint),
        "metadata": typed_json(metadata),
    }
    return proposal_id(ns, "checkpoint", checkpoint_id), record


def writes_record(
    ns: str,
    checkpoint_id: str,
    task_id: str,
    task_path: str,
    writes: Sequence[tuple[str, int, Typed]],
) -> tuple[str, dict[str, Any]]:
    """`writes`: (channel, index, value). Writes of regular channels keep the first
    value a task wrote, so their id names only the task: a task run again after a crash
    is answered with what it wrote first. A batch with a special write is its own
    record (its id names its content too), and replaces what came before."""
    record = {
        "kind": "writes",
        "ns": ns,
        "id": checkpoint_id,
        "task": task_id,
        "path": task_path,
        "writes": [[channel, index, typed_json(value)] for channel, index, value in writes],
    }
    parts = [ns, "writes", checkpoint_id, task_id, task_path]
    if any(index < 0 for _, index, _ in writes):
        parts.append(hashlib.sha256(_json(record)).hexdigest())
    return proposal_id(*parts), record


def proposals(pid: str, record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The (proposal id, checkpoint data) to send for `record`, in order: itself, or its
    parts and then the record naming them."""
    text = _json(record)
    if len(text) <= WHOLE_MAX_BYTES:
        return [(pid, {KEY: record})]
    slices = [text[i : i + PART_BYTES] for i in range(0, len(text), PART_BYTES)]
    sent = [
        (
            proposal_id(pid, "part", str(index)),
            {
                KEY: {
                    "kind": "part",
                    "of": pid,
                    "index": index,
                    "text": base64.b64encode(piece).decode("ascii"),
                }
            },
        )
        for index, piece in enumerate(slices)
    ]
    whole = {"kind": "parts", "of": pid, "count": len(slices)}
    whole["sha256"] = hashlib.sha256(text).hexdigest()
    sent.append((pid, {KEY: whole}))
    return sent


def _json(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), sort_keys=True).encode("ascii")


@dataclass
class Saved:
    checkpoint: Typed
    metadata: Typed
    parent: str | None


@dataclass
class Thread:
    """A thread as its run's history has it: per namespace, its checkpoints in the order
    they were committed, and per checkpoint its pending writes."""

    checkpoints: dict[str, dict[str, Saved]] = field(default_factory=dict)
    #: (ns, checkpoint id) -> (task, index) -> (task, channel, value, task path)
    writes: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, Typed, str]]] = field(
        default_factory=dict
    )

    def latest(self, ns: str) -> str | None:
        """The newest checkpoint id of `ns` (LangGraph's ids sort by time)."""
        return max(self.checkpoints.get(ns, {}), default=None)

    def pending_writes(self, ns: str, checkpoint_id: str) -> list[tuple[str, str, Typed, str]]:
        """A checkpoint's writes in LangGraph's order (`writes_sort_key`)."""
        from langgraph.checkpoint.base import writes_sort_key

        stored = self.writes.get((ns, checkpoint_id), {})
        return [stored[k] for k in sorted(stored, key=lambda k: writes_sort_key(stored[k][3], *k))]

    def apply(self, record: dict[str, Any]) -> None:
        """A whole record (`records` gives them so): added to the thread."""
        if record["kind"] == "checkpoint":
            self.checkpoints.setdefault(record["ns"], {})[record["id"]] = Saved(
                record["checkpoint"], record["metadata"], record["parent"]
            )
        else:
            stored = self.writes.setdefault((record["ns"], record["id"]), {})
            task, path = record["task"], record["path"]
            for channel, index, value in record["writes"]:
                if index >= 0 and (task, index) in stored:
                    continue  # a regular write: the first one stands
                stored[(task, index)] = (task, channel, value, path)


def records(datas: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """The saver's records among checkpoint datas (oldest first), parts joined. Anything
    else is skipped, never raised: a data of another shape, parts that do not add up to
    their SHA-256 (never half a record), a record that is not whole."""
    parts: dict[str, dict[int, bytes]] = {}
    for data in datas:
        if not isinstance(data, dict) or not isinstance(data.get(KEY), dict):
            continue
        record = data[KEY]
        try:
            kind = record.get("kind")
            if kind == "part":
                held = parts.setdefault(str(record["of"]), {})
                held[int(record["index"])] = base64.b64decode(record["text"], validate=True)
            elif kind == "parts":
                held = parts.pop(str(record["of"]), {})
                if int(record["count"]) != len(held):
                    continue
                text = b"".join(held[i] for i in range(len(held)))
                if hashlib.sha256(text).hexdigest() == record["sha256"]:
                    yield _whole(json.loads(text))
            elif kind in ("checkpoint", "writes"):
                yield _whole(record)
        except (KeyError, TypeError, ValueError):
            continue


def _whole(record: Any) -> dict[str, Any]:
    """`record` read through (ValueError, KeyError or TypeError if it is not a whole
    checkpoint or writes record), so that a thread takes it whole or not at all."""
    if record["kind"] == "checkpoint":
        parent = record["parent"]
        if parent is not None and not isinstance(parent, str):
            raise TypeError("parent")
        return {
            "kind": "checkpoint",
            "ns": _text(record["ns"]),
            "id": _text(record["id"]),
            "parent": parent,
            "checkpoint": typed_value(record["checkpoint"]),
            "metadata": typed_value(record["metadata"]),
        }
    if record["kind"] == "writes":
        return {
            "kind": "writes",
            "ns": _text(record["ns"]),
            "id": _text(record["id"]),
            "task": _text(record["task"]),
            "path": _text(record["path"]),
            "writes": [
                (_text(channel), _index(index), typed_value(value))
                for channel, index, value in record["writes"]
            ],
        }
    raise ValueError("kind")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def _index(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError("not an index")
    return value


def thread_of(datas: Iterable[Any]) -> Thread:
    thread = Thread()
    for record in records(datas):
        thread.apply(record)
    return thread


__all__ = [
    "CHECKPOINT_MAX_BYTES",
    "KEY",
    "Saved",
    "Thread",
    "checkpoint_record",
    "proposal_id",
    "proposals",
    "records",
    "thread_of",
    "writes_record",
]
