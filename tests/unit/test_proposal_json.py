"""A proposal read the quick way (`plain_proposal`) is the proposal the model reads, and
whatever the quick way does not take, the model decides: over generated values, valid
and hostile (ids with controls and astral characters, names one character too long or
with a final line feed, integers beyond 64 bits, floats at and beyond 2**63, nesting
past the limit, duplicate keys, unknown fields, other versions, escapes)."""

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from processor.records.intake import decode_proposal
from schemas.ijson import MAX_DEPTH, MAX_EXACT_INTEGER
from schemas.messages import Proposal
from schemas.proposal_json import plain_proposal
from tests.examples import examples

pytestmark = pytest.mark.unit

_ANY_CHAR = st.characters(codec="utf-8", exclude_categories=("Cs",))
_HOSTILE_CHAR = st.one_of(
    st.sampled_from(["\x00", "\x1f", "\x7f", "\x80", "\x9f", "\xa0", "\n", "\U0001f600", "é"]),
    _ANY_CHAR,
)


def _mostly(valid: st.SearchStrategy[Any], *hostile: st.SearchStrategy[Any]) -> Any:
    """`valid` about half the time (so that one hostile field often stands alone among
    valid ones), else one of `hostile`, or `valid` with a final line feed."""
    return st.one_of(*[valid] * 4, valid.map(lambda s: s + "\n"), *hostile)


_VALID_ID = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=40
)
_IDS = _mostly(
    _VALID_ID,
    st.text(_HOSTILE_CHAR, max_size=300),
    st.text(st.sampled_from(["a", "\U0001f600", "é"]), min_size=30, max_size=130),
    st.integers(),
    st.none(),
)
_VALID_NAME = st.from_regex(r"[A-Za-z0-9_.:@/\-]{1,128}", fullmatch=True)
_NAMES = _mostly(
    _VALID_NAME,
    st.just("a" * 128),
    st.just("a" * 129),
    st.text(_HOSTILE_CHAR, max_size=10),
    st.integers(),
)
_INTEGERS = st.one_of(
    st.integers(min_value=-MAX_EXACT_INTEGER, max_value=MAX_EXACT_INTEGER),
    st.sampled_from(
        [
            MAX_EXACT_INTEGER + 1,
            -MAX_EXACT_INTEGER - 1,
            2**63 - 1,
            2**63,
            -(2**63),
            -(2**63) - 1,
            2**64,
            2**64 + 1,
            10**30,
        ]
    ),
    st.integers(),
)
_FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([float(2**63), -float(2**63), 9.2e18, 1e19, 1e300, -0.0, 0.0, 1.0]),
)
_SCALARS = st.one_of(st.none(), st.booleans(), _INTEGERS, _FLOATS, st.text(_HOSTILE_CHAR))
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(_HOSTILE_CHAR), inner, max_size=4)
    ),
    max_leaves=20,
)


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"n": value}
    return value


_OBJECTS = st.one_of(
    st.dictionaries(st.text(_HOSTILE_CHAR, max_size=8), _JSON, max_size=5),
    st.sampled_from([_nested(MAX_DEPTH), _nested(MAX_DEPTH + 1)]),
    _JSON,
)

_ABSENT = object()


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(_ABSENT), strategy)


@st.composite
def proposal_texts(draw: st.DrawFn) -> bytes:
    fields = {
        "schema_version": draw(
            _maybe(st.sampled_from([0, 1, 2, True, 1.0, "1"])), label="schema_version"
        ),
        "proposal_id": draw(_IDS, label="proposal_id"),
        "run_id": draw(_IDS, label="run_id"),
        "event": draw(_NAMES, label="event"),
        "expected_revision": draw(
            _maybe(
                st.one_of(
                    st.none(),
                    st.integers(min_value=0),
                    _INTEGERS,
                    st.booleans(),
                    st.sampled_from([1.0, -1]),
                )
            ),
            label="expected_revision",
        ),
        "reason": draw(
            _maybe(
                st.one_of(
                    st.none(),
                    st.text(_ANY_CHAR, min_size=1, max_size=20),
                    st.text(_HOSTILE_CHAR, max_size=300),
                    st.just("r" * 256),
                    st.just("r" * 257),
                    st.integers(),
                )
            ),
            label="reason",
        ),
        "payload": draw(_maybe(_OBJECTS), label="payload"),
        "metadata": draw(_maybe(_OBJECTS), label="metadata"),
    }
    if draw(st.integers(0, 9)) == 0:
        fields[draw(st.sampled_from(["extra", "Run_id", "payload "]))] = 1
    if draw(st.integers(0, 9)) == 0:
        del fields[draw(st.sampled_from(sorted(fields)))]
    present = {name: value for name, value in fields.items() if value is not _ABSENT}
    text = json.dumps(present, ensure_ascii=draw(st.booleans()))
    if draw(st.integers(0, 9)) == 0:  # a duplicate key, first or last
        name = draw(st.sampled_from(["run_id", "event", "payload", "schema_version"]))
        other = json.dumps(draw(st.one_of(_IDS, _SCALARS)))
        text = (
            "{" + json.dumps(name) + ":" + other + ("," if present else "") + text[1:]
            if draw(st.booleans())
            else text[:-1] + ("," if present else "") + json.dumps(name) + ":" + other + "}"
        )
    return text.encode("utf-8", errors="surrogatepass")


def _model(raw: bytes) -> Proposal | None:
    try:
        return Proposal.model_validate_json(raw)
    except ValidationError:
        return None


@settings(max_examples=examples(2_000), deadline=None)
@given(proposal_texts())
@example(b'{"proposal_id":"p","run_id":"r","event":"e","payload":{"n":123456789012345678901234}}')
@example(b'{"proposal_id":"p","run_id":"r","event":"e","payload":{"n":-9223372036854775809}}')
@example(b'{"proposal_id":"p","run_id":"r","event":"e","payload":{"n":1e400}}')
@example(b'{"proposal_id":"p","run_id":"r","event":"e","payload":{"n":NaN}}')
@example(b'{"proposal_id":"p","run_id":"r\\u0085","event":"e"}')
@example(b'{"proposal_id":"p","run_id":"r","event":"e\\n"}')
@example(b'{"proposal_id":"p","run_id":"\\ud800","event":"e"}')
@example(b'\xef\xbb\xbf{"proposal_id":"p","run_id":"r","event":"e"}')
@example(b'{"proposal_id":"p","run_id":"r","event":"e","reason":"' + b"r" * 257 + b'"}')
@example(b'{"proposal_id":"p\\u0000","run_id":"r","event":"e"}')
@example(b'{"proposal_id":"p","run_id":"r","event":"e","expected_revision":-1}')
@example(b'{"proposal_id":"p","run_id":"r","event":"e","extra":1}')
@example(b'{"proposal_id":"' + "\u00e9".encode() * 65 + b'","run_id":"r","event":"e"}')
@example(  # one level deeper than a payload may nest
    json.dumps(
        {"proposal_id": "p", "run_id": "r", "event": "e", "payload": _nested(MAX_DEPTH + 1)}
    ).encode()
)
def test_the_quick_read_is_the_models_read_or_none(raw: bytes) -> None:
    plain = plain_proposal(raw)
    model = _model(raw)
    if plain is not None:
        assert model is not None, raw
        # The very values, types included (1, 1.0 and true are equal in Python).
        assert plain.model_dump_json() == model.model_dump_json()
        assert plain == model
    # Whatever the quick read leaves, decoding still decides as the model does.
    decoded = decode_proposal(raw, 0, 10**9)
    if model is not None:
        assert (
            isinstance(decoded, Proposal) and decoded.model_dump_json() == model.model_dump_json()
        )
    else:
        assert not isinstance(decoded, Proposal)


@settings(max_examples=examples(500), deadline=None)
@given(
    proposal_id=_VALID_ID,
    run_id=_VALID_ID,
    event=_VALID_NAME,
    expected=st.one_of(st.none(), st.integers(0, MAX_EXACT_INTEGER)),
    payload=st.dictionaries(
        st.text(_ANY_CHAR, max_size=8),
        st.recursive(
            st.one_of(
                st.none(),
                st.booleans(),
                st.integers(-MAX_EXACT_INTEGER, MAX_EXACT_INTEGER),
                st.floats(-1e18, 1e18, allow_nan=False),
                st.text(_ANY_CHAR),
            ),
            lambda inner: st.one_of(
                st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
            ),
            max_leaves=12,
        ),
        max_size=4,
    ),
)
def test_a_plainly_valid_proposal_is_read_the_quick_way(
    proposal_id: str, run_id: str, event: str, expected: int | None, payload: dict[str, Any]
) -> None:
    """The quick way is taken for what agents send (else it would only add its cost)."""
    if len(proposal_id.encode()) > 128:
        proposal_id = proposal_id[:20]
    raw = json.dumps(
        {
            "proposal_id": proposal_id,
            "run_id": run_id,
            "event": event,
            "expected_revision": expected,
            "payload": payload,
        }
    ).encode()
    plain = plain_proposal(raw)
    assert plain is not None
    assert plain.model_dump_json() == Proposal.model_validate_json(raw).model_dump_json()
