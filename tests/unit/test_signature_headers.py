"""A record's signature headers are read the same whichever way they are found: the
key id, signed-at and signature (the first value of each, as text), or the name of the
first of them that appears more than once, for any header list."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.records.intake import Headers, _signature_headers
from processor.trust.signatures import HEADER_KEY_ID, HEADER_SIGNATURE, HEADER_SIGNED_AT

pytestmark = pytest.mark.unit

NAMES = (HEADER_KEY_ID, HEADER_SIGNED_AT, HEADER_SIGNATURE)


def _reference(headers: list[tuple[str, bytes | str | None]]) -> tuple[str | None, ...] | str:
    """The rule, written plainly: three scans of the list."""
    for name in NAMES:
        if sum(1 for found, _ in headers if found == name) > 1:
            return name
    values = []
    for name in NAMES:
        raw = next((raw for found, raw in headers if found == name), None)
        values.append(raw.decode(errors="replace") if isinstance(raw, bytes) else raw)
    return tuple(values)


header_lists = st.lists(
    st.tuples(
        st.one_of(st.sampled_from([*NAMES, "traceparent", "x"]), st.text(max_size=8)),
        st.one_of(st.none(), st.binary(max_size=12), st.text(max_size=12)),
    ),
    max_size=7,
)


@given(header_lists)
def test_signature_headers_follow_the_rule_for_any_header_list(
    headers: list[tuple[str, bytes | str | None]],
) -> None:
    assert _signature_headers(headers) == _reference(headers)


@given(header_lists)
def test_a_mapping_or_none_repeats_nothing(headers: list[tuple[str, bytes | str | None]]) -> None:
    mapping: Headers = dict(headers)
    assert _signature_headers(mapping) == _reference(list(dict(headers).items()))
    assert _signature_headers(None) == (None, None, None)
