"""Times read from what people type, and spans shown as people read them."""

import time

import pytest

from processor.times import duration, now_ms, parse_time

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("0", 0),
        ("1764410400000", 1764410400000),
        ("2025-11-29T10:00:00Z", 1764410400000),
        ("2025-11-29T11:00:00+01:00", 1764410400000),
        ("2025-11-29T10:00:00.250Z", 1764410400250),
    ],
)
def test_epoch_milliseconds_and_iso_8601_times(text: str, ms: int) -> None:
    assert parse_time(text) == ms


def test_a_time_that_says_nothing_certain_is_refused() -> None:
    with pytest.raises(ValueError, match="neither epoch milliseconds nor ISO-8601"):
        parse_time("yesterday")
    with pytest.raises(ValueError, match="neither"):
        parse_time("-5")
    with pytest.raises(ValueError, match="has no time zone; add Z"):
        parse_time("2025-11-29T10:00:00")


@pytest.mark.parametrize(
    ("ms", "tight", "spaced"),
    [
        (0, "0m00s", "0m 00s"),
        (-5_000, "0m00s", "0m 00s"),
        (59_999, "0m59s", "0m 59s"),
        (61_000, "1m01s", "1m 01s"),
        (3_600_000, "1h00m00s", "1h 00m 00s"),
        (90_061_000, "25h01m01s", "25h 01m 01s"),
    ],
)
def test_durations(ms: int, tight: str, spaced: str) -> None:
    assert duration(ms) == tight
    assert duration(ms, " ") == spaced


def test_now_is_the_wall_clock_in_milliseconds() -> None:
    before = int(time.time() * 1000)
    assert before <= now_ms() <= int(time.time() * 1000)
