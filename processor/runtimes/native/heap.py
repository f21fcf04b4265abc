"""The worker process's heap: how often Python's cycle collector runs, and memory the
worker freed given back to the system once it has nothing to do.

The cycle collector. CPython frees almost everything the loop allocates by reference
counting; the collector exists only for reference cycles, which the loop rarely makes.
At its default thresholds it still ran a young collection every 700 allocations and a
full one, over every live object (the machines, the cached snapshots, the libraries'
own), every few seconds: in a native drain that was 15-18 % of the worker's CPU (1.5 s
of 10 s). `tune_collector` runs once the process has started: it freezes what start-up
made (never garbage: the collector stops visiting it) and collects the young
generation after `GC_THRESHOLDS[0]` allocations, so the older generations are visited
that much more rarely. Cyclic garbage still goes, just in larger batches.

glibc's malloc keeps what a thread frees in that thread's arena, for its next
allocations, and returns on its own only the free space at an arena's top. What a busy
worker allocates and frees (librdkafka's fetch and produce buffers, RocksDB's memtables
and compactions, the loop's records) is scattered through its arenas, so a worker that
had drained a backlog kept it resident: in the memory benchmark, 258 MB at 1,000,000
runs, 188 MB after a `malloc_trim`, which hands those pages back (in 1 to 11 ms
there). A turn of the loop that finds no input and no commit to wait for calls it,
not more often than every `TRIM_EVERY_S` and only after work since the last time, so
a loop with input never pays for it. A restore's thread calls it once at its end: the
restore's consumer prefetches up to 256 MB of changelog, and a worker under steady
input, never idle, kept that resident (in a soak, a worker that took a partition over
went to 343 MB and stayed at 175, against 100-127 MB for the others).
"""

import ctypes
import gc
import logging
import math
import time
from collections.abc import Callable

log = logging.getLogger("runstate.worker")

TRIM_EVERY_S = 10.0
#: The collector's thresholds once tuned: young collections every 50,000 allocations
#: (the default is 700); the older generations keep their default ratios.
GC_THRESHOLDS = (50_000, 10, 10)


def tune_collector(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> None:
    """Freeze the objects start-up made and collect less often (see above); call once,
    when the process is ready to work."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class IdleTrim:
    """Call `idle` on every turn of the loop that had nothing to do, with a count of
    the work done so far (proposals decided, records restored)."""

    def __init__(
        self,
        every_s: float = TRIM_EVERY_S,
        trim: Callable[[int], int] | None = None,
    ) -> None:
        self.every_s = every_s
        self._trim = trim or malloc_trim()
        self._last = -math.inf
        self._work = 0

    def idle(self, work: int, now: float) -> None:
        """Trim, if there was work since the last trim and that was `every_s` ago."""
        if self._trim is None or work == self._work or now - self._last < self.every_s:
            return
        self._work, self._last = work, now
        give_back(self._trim)


def give_back(trim: Callable[[int], int] | None = None) -> None:
    """Hand the memory the process freed back to the system, now (see above); nothing
    where the C library has no malloc_trim."""
    trim = trim or malloc_trim()
    if trim is None:
        return
    began = time.perf_counter()
    trim(0)
    log.debug("freed memory given back in %.1f ms", (time.perf_counter() - began) * 1000)
