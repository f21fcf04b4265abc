"""How the soak judges a worker life's memory: from when its bounded caches are full
(not before its first minute), over at least JUDGED_S, under RSS_GROWTH_LIMIT; none
judged is not a pass."""

import pytest

from tests.faults.check import Row
from tests.faults.soak import (
    BLOCK_CACHE_MB,
    JUDGED_S,
    RSS_GROWTH_LIMIT,
    SAMPLE_S,
    SNAPSHOT_CAPACITY,
    WARM_UP_S,
    Life,
    Report,
    caches_full,
    table,
)

pytestmark = pytest.mark.unit


FULL = {"block_cache": BLOCK_CACHE_MB, "memtables": 4.0}


def life(rss: list[float], full_at_s: float | None, started_s: float = 100.0) -> Life:
    """A life sampled every SAMPLE_S from `started_s`: its snapshot cache at capacity
    and its block cache full `full_at_s` in, both filling before."""
    lived = Life(0, 1, started_s)
    for n, mb in enumerate(rss):
        at = started_s + n * SAMPLE_S
        lived.rss.append((at, mb))
        lived.heap.append((at, mb - 10))
        full = full_at_s is not None and n * SAMPLE_S >= full_at_s
        filling = SNAPSHOT_CAPACITY * (n + 1) // (len(rss) + 1)
        lived.sampled(
            at,
            FULL if full else {"block_cache": 0.5 * BLOCK_CACHE_MB},
            SNAPSHOT_CAPACITY if full else filling,
        )
    return lived


def report(*lives: Life) -> Report:
    row = Row("soak", "native", 1_000, len(lives), lag_zero=True)
    return Report(1.0, 1.0, 2.0, row, [], list(lives), [])


def filling_then_flat(minutes: float, full_at_s: float) -> list[float]:
    """RSS rising 2 MB a sample while caches fill, then flat within ±1 MB."""
    samples = int(minutes * 60 / SAMPLE_S) + 1
    filled = int(full_at_s / SAMPLE_S)
    return [80.0 + 2 * min(n, filled) + (n % 2) for n in range(samples)]


def test_a_life_is_judged_from_when_its_caches_are_full() -> None:
    lived = life(filling_then_flat(8, 180), 180)
    assert lived.judged()
    assert lived.warm_s == lived.started_s + 180
    growth = lived.growth()
    assert growth is not None and growth < RSS_GROWTH_LIMIT
    first_minute = lived.growth_from_first_minute()
    assert first_minute is not None and first_minute > RSS_GROWTH_LIMIT  # the fill itself
    assert report(lived).clean


def test_caches_full_sooner_than_the_first_minute_still_wait_for_it() -> None:
    lived = life([90.0] * 40, 10)
    assert lived.warm_s == lived.started_s + WARM_UP_S


def test_growth_after_the_caches_are_full_is_not_flat() -> None:
    rss = filling_then_flat(3, 60) + [82.0 + 2 * 6 + 1.5 * n for n in range(1, 20)]
    lived = life(rss, 60)
    growth = lived.growth()
    assert growth is not None and growth > RSS_GROWTH_LIMIT
    assert not report(lived).clean
    assert table(report(lived)).split("\n")[4].endswith(f"+{100 * growth:.1f} % (1) |")


def test_a_life_too_short_after_its_warm_up_or_never_warm_is_not_judged() -> None:
    short = life(filling_then_flat(4, 180), 180)  # 60 s after warm-up
    never = life(filling_then_flat(10, 600), None)
    for lived in (short, never):
        assert not lived.judged() and lived.growth() is None
    assert short.rss[-1][0] - (short.warm_s or 0) < JUDGED_S
    # none judged: no evidence of flat memory, so not clean; the table says so
    assert not report(short, never).clean
    assert "none judged" in table(report(short, never))


def test_what_counts_as_full() -> None:
    at_capacity = [(0.0, SNAPSHOT_CAPACITY)]
    assert caches_full(FULL, at_capacity, 0.0)
    assert not caches_full({"block_cache": 0.9 * BLOCK_CACHE_MB}, at_capacity, 0.0)
    assert not caches_full(FULL, [], 0.0)  # a worker without the gauge
    # Under capacity: full once it grew by under 5 % over the last minute...
    steady = [(0.0, 500), (30.0, 700), (60.0, 780), (90.0, 800), (120.0, 805)]
    assert not caches_full(FULL, steady[:2], 30.0)  # no minute to compare yet
    assert not caches_full(FULL, steady[:3], 60.0)  # 500 -> 780
    assert not caches_full(FULL, steady[:4], 90.0)  # 700 -> 800
    assert caches_full(FULL, steady, 120.0)  # 780 -> 805
    # ...and not while it still grows.
    assert not caches_full(FULL, [(0.0, 700), (60.0, 900)], 60.0)


def test_a_snapshot_cache_that_levels_off_under_capacity_ends_the_warm_up() -> None:
    """Most of a workload's runs finish: the cache holds the unfinished ones, far fewer
    than its capacity, and levels off there."""
    lived = Life(0, 1, 0.0)
    for n in range(40):
        at = n * SAMPLE_S
        lived.rss.append((at, 90.0))
        lived.sampled(at, FULL, min(800, 100 * (n + 1)))
    # 800 from the 8th sample on (70 s): a minute later it has grown by under 5 %
    assert lived.caches_full_s == 130.0
    assert lived.judged() and lived.growth() == 0.0
