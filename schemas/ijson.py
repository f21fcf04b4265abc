"""Integers every JSON reader keeps exactly (I-JSON, RFC 7493), and nesting every reader
here reads back.

Most JSON readers hold a number as a double (JavaScript's `JSON.parse`, Go decoding into
`any`), and a double holds every integer only within ±(2**53 − 1): a verifier in another
language would read a larger one back as another number, and recompute another hash,
and RFC 8785 (canonical JSON for hashing) refuses it outright. What reaches a transition
is held to that range where it comes in: a proposal's payload and metadata
(`ExactJsonObject`), and the numbers of a machine spec (`MAX_EXACT_INTEGER`).

A payload nested too deeply is refused for the same reason: the processor stores it
inside a run's snapshot, a few levels deeper, and a parser with a recursion limit (the
processor's own stops near 200 levels) could not read that snapshot back.
"""

import json
import math
from typing import Annotated

from pydantic import AfterValidator, JsonValue
from pydantic_core import PydanticCustomError

MAX_EXACT_INTEGER = 2**53 - 1
#: How many levels a payload or metadata object may nest, itself the first: far below
#: any parser's recursion limit even inside a snapshot or a transition.
MAX_DEPTH = 64
#: How much of an offending value's path a refusal shows.
_MAX_SHOWN_PATH = 120


def _offence(value: object, room: int) -> tuple[float | None, list[str | int]] | None:
    """The first offence in `value` and its path, innermost key first: an integer beyond
    ±MAX_EXACT_INTEGER (the integer), a number that is not finite (NaN, an infinity, or
    one beyond a double's range as read: JSON has none, and it would be written back as
    null), or an object or array when `room` more levels of them are all that is allowed
    (None). One walk for all: this runs per proposal."""
    if isinstance(value, int):  # bool too: always within
        return None if -MAX_EXACT_INTEGER <= value <= MAX_EXACT_INTEGER else (value, [])
    if isinstance(value, float):
        return None if math.isfinite(value) else (value, [])
    if isinstance(value, dict):
        if room <= 0:
            return None, []
        for key, item in value.items():
            found = _offence(item, room - 1)
            if found is not None:
                found[1].append(key)
                return found
    elif isinstance(value, list):
        if room <= 0:
            return None, []
        for index, item in enumerate(value):
            found = _offence(item, room - 1)
            if found is not None:
                found[1].append(index)
                return found
    return None


def _step(step: str | int) -> str:
    if isinstance(step, int):
        return f"[{step}]"
    return f".{step}" if step.isprintable() else f".{json.dumps(step)}"  # one line


def _where(path: list[str | int]) -> str:
    where = "".join(_step(step) for step in reversed(path))
    return where[:_MAX_SHOWN_PATH] + "..." if len(where) > _MAX_SHOWN_PATH else where


def _describe(value: float | None, path: list[str | int]) -> str:
    if value is None:
        return (
            f"value at {_where(path)} is nested more than {MAX_DEPTH} levels deep (objects "
            "and arrays, the payload or metadata itself the first); flatten it, or send it "
            "as a string"
        )
    if isinstance(value, float):
        return (
            f"number at {_where(path)} is not finite (NaN, Infinity, or beyond a double's "
            "range): JSON has no such number; send it as a string"
        )
    # A 4,000-digit integer would fill the detail (and Python prints none longer).
    shown = str(value) if value.bit_length() <= 64 else f"of {value.bit_length()} bits"
    return (
        f"integer {shown} at {_where(path)} is beyond ±(2**53-1), the integers every JSON "
        "reader keeps exactly (I-JSON); send a larger number as a string"
    )


def _exact(obj: dict[str, JsonValue]) -> dict[str, JsonValue]:
    found = _offence(obj, MAX_DEPTH)
    if found is not None:
        code = (
            "too_deep"
            if found[0] is None
            else "not_finite"
            if isinstance(found[0], float)
            else "inexact_integer"
        )
        raise PydanticCustomError(code, "{detail}", {"detail": _describe(*found)})
    return obj


#: A JSON object whose integers are all within ±MAX_EXACT_INTEGER, nested at most
#: MAX_DEPTH levels.
ExactJsonObject = Annotated[dict[str, JsonValue], AfterValidator(_exact)]
