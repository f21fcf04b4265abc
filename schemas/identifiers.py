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

import re
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
    # At most `limit` bytes is at most `limit` characters. Of ASCII, the printable
    # characters are exactly those outside the controls the pattern excludes. (Every
    # proposal is checked here: `schemas.proposal_json`.)
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        return False
    if value.isascii():
        return value.isprintable()
    if _TEXT_ID(value) is None:
        return False
    try:
        return len(value.encode("utf-8")) <= limit
    except UnicodeEncodeError:  # a lone surrogate
        return False


def is_run_id(value: object) -> bool:
    """Whether `value` is a valid run id (the same rule as the RunId type, without pydantic)."""
    return _is_text_id(value, MAX_RUN_ID_BYTES)


def is_proposal_id(value: object) -> bool:
    return _is_text_id(value, MAX_PROPOSAL_ID_BYTES)


def is_name(value: object) -> bool:
    return isinstance(value, str) and len(value) <= MAX_NAME_CHARS and _NAME(value) is not None


#: The patterns above, whole-string (Python's `$` would also match before a final line
#: feed; the models' patterns do not).
_NAME = re.compile(NAME_PATTERN[1:-1]).fullmatch
_TEXT_ID = re.compile(TEXT_ID_PATTERN[1:-1]).fullmatch
