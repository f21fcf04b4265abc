"""The hash chain's JSON is RFC 8785's: the fast path against the rfc8785 package, and
both against the RFC's own examples. And the index header's JSON, written by hand, is
json.dumps's."""

import hashlib
import json
import struct
from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.records.changelog_keys import parse_index, snapshot_index
from schemas import Principal
from schemas.audit import (
    _canonical,
    _fast,
    _plain,
    canonical_text,
    canonical_values,
    transition_hash,
)
from schemas.messages import RunSnapshot, Timer
from tests.examples import examples

PROPERTY = settings(
    max_examples=examples(300),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
MAX = 2**53 - 1

# -- generated JSON -------------------------------------------------------------------
#: Where the two encoders could part: every escape, DEL, the line separators JavaScript
#: once had to escape, the top of the BMP (above the surrogates) and astral characters.
SPECIAL_CHARS = [
    *(chr(c) for c in range(0x20)),
    '"',
    "\\",
    "/",
    "\x7f",
    "\x80",
    "\x9f",
    "é",
    "\u2028",
    "\u2029",
    "\ud7ff",
    "\ue000",
    "\ufb33",
    "\ufeff",
    "\uffff",
    "\U00010000",
    "\U0001f600",
    "\U0010ffff",
]
chars = st.one_of(st.sampled_from(SPECIAL_CHARS), st.characters(exclude_categories=("Cs",)))
texts = st.text(chars, max_size=8)
#: Keys that sort differently by code point and by UTF-16 code unit, often in one object.
keys = texts | st.text(st.sampled_from(["a", "é", "\ue000", "\uffff", "\U00010000", "\U0001f600"]))
ints = st.one_of(
    st.integers(-MAX, MAX),
    st.sampled_from([0, 1, -1, MAX, -MAX, 2**31, 2**32, 2**52]),
)
#: Floats where Python's repr and ECMAScript's part: integral ones, exponents either
#: side of ECMAScript's switch (1e21, 1e-7) and Python's (1e16, 1e-5), the extremes.
SPECIAL_FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    1e-5,
    1e-6,
    1e-7,
    1.5e-7,
    1e16,
    1e20,
    1e21,
    1.2345e21,
    1e22,
    1e23,
    2.0**53,
    2.0**70,
    5e-324,
    -5e-324,
    1.7976931348623157e308,
    333333333.33333329,
    0.1 + 0.2,
]
floats = st.one_of(
    st.sampled_from(SPECIAL_FLOATS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**70), 2**70).map(float),
    st.builds(lambda m, e: float(f"{m}e{e}"), st.integers(1, 999), st.integers(-330, 310)).filter(
        lambda f: f != float("inf")
    ),
)


def json_values(leaves: st.SearchStrategy[Any], keys: st.SearchStrategy[str]) -> Any:
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
        max_leaves=16,
    )


#: No float, integers within I-JSON's range: the fast path takes them unless a key has
#: a character above U+FFFF.
float_free_values = json_values(st.none() | st.booleans() | ints | texts, keys)
#: Anything RFC 8785 can write.
any_values = json_values(st.none() | st.booleans() | ints | floats | texts, keys)


def _astral_key(value: Any) -> bool:
    if isinstance(value, dict):
        return any(max(k, default="") > "\uffff" or _astral_key(v) for k, v in value.items())
    return isinstance(value, list) and any(map(_astral_key, value))


@PROPERTY
@given(st.lists(float_free_values, max_size=5))
def test_the_fast_path_writes_exactly_what_rfc8785_writes(values: list[Any]) -> None:
    expected = rfc8785.dumps(values)
    assert _canonical(values) == expected
    assert _plain(values) is not _astral_key(values)
    if _plain(values):
        assert _fast(values) == expected


@PROPERTY
@given(st.lists(any_values, max_size=5))
def test_canonical_json_is_rfc8785_whatever_the_values(values: list[Any]) -> None:
    expected = rfc8785.dumps(values)
    assert _canonical(values) == expected and canonical_text(values) == expected.decode()
    if _plain(values):
        assert _fast(values) == expected


@pytest.mark.parametrize(
    "value",
    [
        1.0,
        -0.0,
        1e-6,
        1e16,
        [{"k": 2.0}],
        {"\ue000": 1, "\U0001f600": 2},
        {"a": {"\U0001f600\ue000": 1, "\U0001f600\U0001f600": 2}},
    ],
    ids=["1.0", "-0.0", "1e-6", "1e16", "nested-float", "astral-key", "nested-astral-key"],
)
def test_what_orjson_writes_otherwise_goes_to_rfc8785(value: Any) -> None:
    values = [value]
    assert not _plain(values)
    assert _fast(values) != rfc8785.dumps(values) == _canonical(values)


@pytest.mark.parametrize(
    "value",
    [2**53, -(2**53), [1, {"a": 10**30}], float("nan"), float("inf"), "\ud800", {"\udfff": 1}],
    ids=["2**53", "-2**53", "10**30", "nan", "inf", "lone-surrogate", "surrogate-key"],
)
def test_what_rfc8785_cannot_write_has_no_hash(value: Any) -> None:
    with pytest.raises(ValueError):
        _canonical([value])
    fields = dict(_fields(), metadata={"x": value})
    with pytest.raises(ValueError):
        transition_hash(fields)


def test_only_the_exact_builtin_types_take_the_fast_path() -> None:
    assert _plain([None, True, False, 0, MAX, -MAX, "", "x\u2028", [], {}, {"": [{"a": 1}]}])
    for value in [(1, 2), 1.5, MAX + 1, -MAX - 1, {1: 1}, {"\U00010000": 1}, object()]:
        assert not _plain([value]), value


@pytest.mark.parametrize("depth", [1, 250, 260, 600])
def test_values_nested_deeper_than_orjson_goes_are_written_by_rfc8785(depth: int) -> None:
    # orjson refuses to nest past 254 levels; the fallback writes the same bytes.
    value: Any = {"k": "\u2028"}
    for level in range(depth):
        value = [value] if level % 2 else {"n": value}
    assert _plain([value])
    assert _canonical([value]) == rfc8785.dumps([value])


# -- RFC 8785's own examples ----------------------------------------------------------
#: Appendix B: IEEE 754 bit patterns and their canonical text.
APPENDIX_B = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


def _double(bits: str) -> float:
    number: float = struct.unpack(">d", bytes.fromhex(bits))[0]
    return number


@pytest.mark.parametrize(("bits", "text"), APPENDIX_B, ids=[b for b, _ in APPENDIX_B])
def test_rfc8785_appendix_b_numbers(bits: str, text: str) -> None:
    assert _canonical([_double(bits)]) == f"[{text}]".encode()
    assert _canonical([{"n": _double(bits)}]) == f'[{{"n":{text}}}]'.encode()


@pytest.mark.parametrize("bits", ["7fffffffffffffff", "7ff0000000000000"], ids=["NaN", "Infinity"])
def test_rfc8785_appendix_b_numbers_json_has_not(bits: str) -> None:
    with pytest.raises(ValueError):
        _canonical([_double(bits)])


def test_rfc8785_sorting_example() -> None:
    """Section 3.2.3: keys by UTF-16 code units, so the emoji (U+D83D U+DE00) sorts
    before U+FB33, though its code point, U+1F600, is the larger."""
    value = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    order = ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    expected = "[{" + ",".join(f'"{k}":"{value[k]}"' for k in order).replace("\r", "\\r") + "}]"
    assert _canonical([value]) == expected.encode()


def test_rfc8785_sample() -> None:
    """Section 3.2.2's input and its canonical form (section 3.2.3)."""
    value = {
        "numbers": [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001],
        "string": "\u20ac$\u000f\u000aA'\u0042\u0022\u005c\\\"/",
        "literals": [None, True, False],
    }
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert _canonical([value]) == f"[{expected}]".encode()


# -- the transition hash --------------------------------------------------------------
def _fields(**changes: Any) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "transition_id": "r:3",
        "run_id": "r",
        "machine": "m",
        "revision": 3,
        "from_state": "a",
        "to_state": "é☃",
        "event": "e",
        "proposal_id": 'p\n"q',
        "principal": Principal(source="tool:x", authority="tool_executor"),
        "reason": None,
        "payload": {},
        "metadata": {},
        "retry_count": 0,
        "at_ms": 1_800_000_000_000,
        "prev_hash": "ab" * 32,
        **changes,
    }


def test_a_transition_hash_by_hand() -> None:
    """The hashed text written out by hand, as a verifier in another language sees it."""
    fields = _fields(
        payload={"score": 1.0, "tiny": 1e-7, "\U0001f600": 1, "\ue000": 2},
        metadata={"n": MAX},
        machine_version="0123456789abcdef",
        heartbeat_at_ms=1_800_000_000_500,
    )
    text = (
        '[1,"r:3","r","m",3,"a","é☃","e","p\\n\\"q","tool:x","tool_executor",null,'
        '{"score":1,"tiny":1e-7,"\U0001f600":1,"\ue000":2},{"n":9007199254740991},0,'
        '1800000000000,"' + "ab" * 32 + '",'
        '{"heartbeat_at_ms":1800000000500,"machine_version":"0123456789abcdef"}]'
    )
    assert transition_hash(fields) == hashlib.sha256(text.encode()).hexdigest()


class _Text(str):
    """A subclass of str: orjson writes it only when told to, rfc8785 as text."""


class _Int(int):
    pass


@PROPERTY
@given(
    st.text(min_size=1),
    st.none() | texts,
    st.none() | texts | texts.map(_Text),
    st.dictionaries(texts, any_values, max_size=3),
    st.dictionaries(texts, any_values, max_size=3),
    st.integers(0, MAX) | st.integers(0, 2**64) | st.integers(0, MAX).map(_Int),
    st.none() | st.text("0123456789abcdef", min_size=16, max_size=16),
    st.none() | st.integers(0, MAX) | st.integers(-(2**64), 2**64),
)
def test_transition_hash_is_sha256_of_the_rfc8785_text(
    run_id: str,
    from_state: str | None,
    reason: str | None,
    payload: dict[str, Any],
    metadata: dict[str, Any],
    at: int,
    machine_version: str | None,
    heartbeat: int | None,
) -> None:
    """Whatever the payload and metadata hold, and typed fields with integers beyond
    I-JSON's range or subclasses of str and int: the hash is of RFC 8785's text, or
    there is none where RFC 8785 has no text."""
    fields = _fields(
        transition_id=f"{run_id}:3",
        run_id=run_id,
        from_state=from_state,
        reason=reason,
        payload=payload,
        metadata=metadata,
        at_ms=at,
        machine_version=machine_version,
        heartbeat_at_ms=heartbeat,
    )
    try:
        canonical = rfc8785.dumps(canonical_values(fields))
    except ValueError:
        with pytest.raises(ValueError):
            transition_hash(fields)
        return
    assert transition_hash(fields) == hashlib.sha256(canonical).hexdigest()


_ANY_TEXT = st.text(max_size=20)  # quotes, backslashes, controls, non-ASCII, surrogates
_ANY_INT = st.integers(min_value=-(2**63), max_value=2**63)


@PROPERTY
@given(
    machine=_ANY_TEXT,
    state=_ANY_TEXT,
    entered=_ANY_INT,
    timers=st.lists(st.tuples(_ANY_INT, _ANY_INT, _ANY_TEXT), max_size=4),
)
def test_the_index_header_is_the_json_it_always_was(
    machine: str, state: str, entered: int, timers: list[tuple[int, int, str]]
) -> None:
    """snapshot_index writes by hand what json.dumps wrote, for any text, and reads back."""
    snapshot = RunSnapshot.model_construct(
        machine=machine,
        state=state,
        entered_state_at_ms=entered,
        timers=[
            Timer.model_construct(due_at_ms=due, revision=revision, name=name)
            for due, revision, name in timers
        ],
    )
    written = [machine, state, entered, [list(t) for t in timers]]
    assert snapshot_index(snapshot) == json.dumps(written, separators=(",", ":")).encode()
    assert parse_index(snapshot_index(snapshot)) == ((machine, state, entered), timers)
