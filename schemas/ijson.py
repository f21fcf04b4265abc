"""Integers every JSON reader keeps exactly (I-JSON, RFC 7493).

Most JSON readers hold a number as a double (JavaScript's `JSON.parse`, Go decoding into
`any`), and a double holds every integer only within ±(2**53 − 1): a verifier in another
language would read a larger one back as another number, and recompute another hash,
and RFC 8785 (canonical JSON for hashing) refuses it outright. What reaches a transition
is held to that range where it comes in: a proposal's payload and metadata
(`ExactJsonObject`), and the numbers of a machine spec (`MAX_EXACT_INTEGER`).
"""

from typing import Annotated

from pydantic import AfterValidator, JsonValue
from pydantic_core import PydanticCustomError

MAX_EXACT_INTEGER = 2**53 - 1
#: How much of an offending value's path a refusal shows.
_MAX_SHOWN_PATH = 120


def inexact_integer(value: object) -> tuple[int, list[str | int]] | None:
    """The first integer beyond ±MAX_EXACT_INTEGER in `value` and its path, innermost
    key first (built only when one is found); None when there is none."""
    if isinstance(value, int):  # bool too: always within
        return None if -MAX_EXACT_INTEGER <= value <= MAX_EXACT_INTEGER else (value, [])
    if isinstance(value, dict):
        for key, item in value.items():
            found = inexact_integer(item)
            if found is not None:
                found[1].append(key)
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = inexact_integer(item)
            if found is not None:
                found[1].append(index)
                return found
    return None


def _describe(value: int, path: list[str | int]) -> str:
    # A 4,000-digit integer would fill the detail (and Python prints none longer).
    shown = str(value) if value.bit_length() <= 64 else f"of {value.bit_length()} bits"
    where = "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in reversed(path))
    if len(where) > _MAX_SHOWN_PATH:
        where = where[:_MAX_SHOWN_PATH] + "..."
    return (
        f"integer {shown} at {where} is beyond ±(2**53-1), the integers every JSON reader "
        "keeps exactly (I-JSON); send a larger number as a string"
    )


def _exact(obj: dict[str, JsonValue]) -> dict[str, JsonValue]:
    found = inexact_integer(obj)
    if found is not None:
        raise PydanticCustomError("inexact_integer", "{detail}", {"detail": _describe(*found)})
    return obj


#: A JSON object whose integers are all within ±MAX_EXACT_INTEGER.
ExactJsonObject = Annotated[dict[str, JsonValue], AfterValidator(_exact)]
