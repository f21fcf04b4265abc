"""What an identifier may be: the run ids, proposal ids and names that become Kafka keys,
RocksDB keys, file names in logs and strings in other languages.

- **Names** (machines, states, events, steps): 1..128 ASCII letters, digits and `_ . : @ / -`.
- **Run ids** (1..256 bytes) and **proposal ids** (1..128 bytes), counted in UTF-8: any
  Unicode scalar value except control characters (U+0000..U+001F, U+007F..U+009F).

A run id is the record key of every topic and the tail of every store key, so it must
encode to the same bytes everywhere: a lone surrogate (which JSON's `\\ud800` escape can
spell) does not encode at all, and a control character would let an id spell the
store's own key prefixes. A JSON Schema `maxLength` counts characters, so the byte
limit is stated in each field's description and checked here.
"""

from typing import Annotated

from pydantic import AfterValidator, Field

NAME_PATTERN = r"^[A-Za-z0-9_.:@/\-]+$"
#: No C0 or C1 control character (ECMA-262 and Rust regex syntax alike).
TEXT_ID_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]+$"
MAX_NAME_CHARS = 128
MAX_RUN_ID_BYTES = 256
MAX_PROPOSAL_ID_BYTES = 128


def utf8_length_at_most(limit: int) -> AfterValidator:
    def check(value: str) -> str:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError as exc:  # only reachable from Python, not from JSON
            raise ValueError("must be valid Unicode (a lone surrogate is not)") from exc
        if size > limit:
            raise ValueError(f"is {size} bytes in UTF-8; the limit is {limit}")
        return value

    return AfterValidator(check)


Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS, pattern=NAME_PATTERN)]
RunId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_RUN_ID_BYTES,
        pattern=TEXT_ID_PATTERN,
        description=f"At most {MAX_RUN_ID_BYTES} bytes in UTF-8; no control characters.",
    ),
    utf8_length_at_most(MAX_RUN_ID_BYTES),
]
ProposalId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_PROPOSAL_ID_BYTES,
        pattern=TEXT_ID_PATTERN,
        description=f"At most {MAX_PROPOSAL_ID_BYTES} bytes in UTF-8; no control characters; "
        "unique per run (repeats are refused 'duplicate').",
    ),
    utf8_length_at_most(MAX_PROPOSAL_ID_BYTES),
]


def _is_text_id(value: object, limit: int) -> bool:
    if not isinstance(value, str) or not value:
        return False
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return len(raw) <= limit and not any(c < 0x20 or 0x7F <= c <= 0x9F for c in map(ord, value))


def is_run_id(value: object) -> bool:
    """Whether `value` is a valid run id (the same rule as the RunId type, without pydantic)."""
    return _is_text_id(value, MAX_RUN_ID_BYTES)


def is_proposal_id(value: object) -> bool:
    return _is_text_id(value, MAX_PROPOSAL_ID_BYTES)


def is_name(value: object) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_NAME_CHARS
        and value.isascii()
        and all(c.isalnum() or c in "_.:@/-" for c in value)
    )
