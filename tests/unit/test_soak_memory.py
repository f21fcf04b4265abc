"""How the soak judges a worker life's memory: from when its bounded caches are full
(not before its first minute), over at least JUDGED_S, under RSS_GROWTH_LIMIT; none
judged is not a pass."""

import pytest

from tests.faults.check import Row
from tests.faults.soak import (
    BLOCK_CACHE_MB,
    JUDGED_S,
    LEVEL_WINDOW_S,
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
    # Under capacity: full once its highest over LEVEL_WINDOW_S is under 5 % above its
    # highest over the window before...
    w = LEVEL_WINDOW_S
    steady = [(0.0, 500), (w / 2, 700), (w, 780), (1.5 * w, 800), (2 * w, 805), (2.5 * w, 790)]
    assert not caches_full(FULL, steady[:3], w)  # no window before a window yet
    assert not caches_full(FULL, steady[:4], 1.5 * w)  # 700 -> 800
    assert caches_full(FULL, steady[:5], 2 * w)  # 780 -> 805
    assert caches_full(FULL, steady, 2.5 * w)  # 800 -> 805
    # ...and not while it still grows.
    assert not caches_full(FULL, [(0.0, 700), (w, 900), (2 * w, 1_100)], 2 * w)


# A worker's snapshot cache in the soak at 5f00435 (seconds into its life, runs cached):
# rising about 400 runs a minute, down and up again between samples.
SAW_TOOTH = [
    (0, 628),
    (10, 454),
    (20, 792),
    (31, 644),
    (41, 318),
    (52, 825),
    (62, 990),
    (72, 722),
    (82, 895),
    (93, 915),
    (103, 1030),
    (114, 1563),
    (125, 1110),
    (135, 1575),
    (145, 1235),
    (155, 1808),
    (165, 1357),
    (176, 1962),
    (186, 1472),
    (196, 2045),
    (206, 1584),
    (217, 2018),
    (227, 1707),
    (238, 2213),
    (248, 1827),
    (258, 2434),
    (269, 1957),
    (279, 2378),
    (290, 2090),
    (301, 2446),
    (312, 2202),
    (322, 2486),
    (333, 3034),
    (343, 2624),
    (353, 3115),
    (364, 2712),
    (374, 3250),
    (385, 2822),
    (395, 3370),
    (406, 2913),
    (416, 3431),
    (427, 3000),
    (438, 3454),
    (448, 3086),
    (459, 3521),
    (469, 3231),
    (480, 3585),
    (491, 3349),
    (502, 3658),
    (512, 4111),
    (523, 3745),
    (534, 4258),
    (545, 3822),
    (555, 4319),
    (566, 3911),
    (576, 4460),
    (587, 4046),
    (597, 4552),
    (607, 4160),
    (618, 4620),
    (628, 4269),
    (639, 4700),
    (649, 4385),
    (660, 4763),
    (670, 4510),
    (681, 4870),
    (691, 5154),
    (702, 4917),
    (713, 5411),
    (723, 5034),
    (734, 5554),
    (745, 5103),
    (755, 5670),
    (766, 5224),
    (776, 5731),
    (787, 5341),
    (798, 5812),
    (808, 5431),
    (819, 5746),
    (829, 5443),
]


def test_a_snapshot_cache_that_saw_tooths_upwards_is_not_level() -> None:
    """A trough a minute after a peak is not a level: the old rule (the last sample
    against the one a minute before) took this cache for level 322 s in, at 2,486 runs,
    and the life's RSS rose 11 % after."""
    for n in range(1, len(SAW_TOOTH) + 1):
        assert not caches_full(FULL, SAW_TOOTH[:n], SAW_TOOTH[n - 1][0]), SAW_TOOTH[n - 1]


def test_a_snapshot_cache_that_levels_off_under_capacity_ends_the_warm_up() -> None:
    """Runs not used for the cache's idle time leave it: under a steady load it holds the
    runs used lately, far fewer than its capacity, and levels off there."""
    lived = Life(0, 1, 0.0)
    for n in range(40):
        at = n * SAMPLE_S
        lived.rss.append((at, 90.0))
        lived.sampled(at, FULL, min(800, 100 * (n + 1)))
    # 800 from the 8th sample on (70 s): the first LEVEL_WINDOW_S ending 120 s later
    # has grown by under 5 % over the one before it (0 to 70 s, 800 at its end)
    assert lived.caches_full_s == 70.0 + LEVEL_WINDOW_S
    assert lived.judged() and lived.growth() == 0.0
