"""The fault harness's recovery figure: the longest stall of any partition's answers
after a fault, as a reader saw them."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.examples import examples
from tests.faults.arrivals import recovery_seconds

pytestmark = pytest.mark.unit

STEP = 0.01  # answers every 10 ms while nothing is wrong


def _stream(start: float, end: float, stalls: list[tuple[float, float]]) -> list[float]:
    """Answers every STEP from `start` to `end`, none inside any (from, to) stall."""
    # Times by counting steps, not by adding STEP up: a sum drifts, and an answer at a
    # stall's very edge fell inside it or out of it by the drift alone.
    out = []
    for i in range(round((end - start) / STEP)):
        t = round(start + i * STEP, 4)
        if not any(a < t < b for a, b in stalls):
            out.append(t)
    return out


@settings(max_examples=examples(200), deadline=None)
@given(
    partitions=st.integers(1, 4),
    fault=st.floats(5.0, 40.0),
    delay=st.floats(0.0, 3.0),
    length=st.floats(0.5, 15.0),
    victim=st.integers(0, 3),
)
def test_the_longest_stall_after_a_fault_is_its_recovery(
    partitions: int, fault: float, delay: float, length: float, victim: int
) -> None:
    """One partition stops answering `delay` s after the fault for `length` s (a moved
    leader, a rebalance); the others go on. Recovery is that stall, to within the spacing
    of answers, whether it began at the fault or later."""
    victim %= partitions
    stall = (fault + delay, fault + delay + length)
    times = {p: _stream(0.0, 60.0, [stall] if p == victim else []) for p in range(partitions)}
    (got,) = recovery_seconds([fault], times, until=59.5)
    expected = length if delay >= STEP else delay + length
    assert got == pytest.approx(expected, abs=2 * STEP)


def test_a_stall_after_the_feed_ended_is_not_a_fault() -> None:
    """Answers stop when the proposals do; the silence after is not recovery."""
    times = {0: [*_stream(0.0, 20.0, [(10.0, 12.0)]), 50.0]}
    assert recovery_seconds([9.5], times, until=19.5) == [pytest.approx(2.0, abs=0.05)]


def test_each_fault_is_measured_up_to_the_next() -> None:
    times = {0: _stream(0.0, 40.0, [(10.0, 14.0), (20.0, 21.0)])}
    first, second = recovery_seconds([10.0, 20.0], times, until=39.5)
    assert first == pytest.approx(4.0, abs=0.05)
    assert second == pytest.approx(1.0, abs=0.05)


def test_a_partition_that_never_answers_again_counts_to_the_end() -> None:
    times = {0: _stream(0.0, 30.0, []), 1: _stream(0.0, 10.0, [])}
    assert recovery_seconds([10.0], times, until=29.5) == [pytest.approx(19.5, abs=0.05)]
