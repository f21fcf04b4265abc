"""Memory the worker freed, given back to the system once it has nothing to do.

glibc's malloc keeps what a thread frees in that thread's arena, for its next
allocations, and returns on its own only the free space at an arena's top. What a busy
worker allocates and frees (librdkafka's fetch and produce buffers, RocksDB's memtables
and compactions, the loop's records) is scattered through its arenas, so a worker that
had drained a backlog kept it resident: in the memory benchmark, 258 MB at 1,000,000
runs, 188 MB after a `malloc_trim`, which hands those pages back (in 1 to 11 ms
there). A turn of the loop that finds no input and no commit to wait for calls it,
not more often than every `TRIM_EVERY_S` and only after work since the last time, so
a loop with input never pays for it.
"""

import ctypes
import logging
import math
import time
from collections.abc import Callable

log = logging.getLogger("runstate.worker")

TRIM_EVERY_S = 10.0


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
        began = time.perf_counter()
        self._trim(0)
        log.debug("freed memory given back in %.1f ms", (time.perf_counter() - began) * 1000)
