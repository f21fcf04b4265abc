"""Reads wait for the writes already under way: what makes a worker's HTTP reads show
every transition committed before the read was asked.

A worker publishes a transition, and only then moves the state it serves: the native
worker applies a checkpoint's changes to its stores after the transaction commits (an
aborted one must leave no trace), the Faust worker writes its table after the outcome's
records are acknowledged. In between, a reader who already saw the transition on the
topic (or whose agent wrote it just before crashing) would read the run as it was
before. Each such write is opened here before its outcome can be seen and closed once
the state has it (or it is dropped); a read waits until every write open when it came
is closed."""

import threading
import time


class ReadFence:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._open: set[int] = set()
        self._next = 0

    def open(self) -> int:
        """A write whose outcome may be seen before the state has it; close it with the
        token returned, whatever becomes of the write."""
        with self._changed:
            self._next += 1
            self._open.add(self._next)
            return self._next

    def close(self, token: int) -> None:
        with self._changed:
            self._open.discard(token)
            self._changed.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait until every write open now is closed; False when `timeout` ran out first."""
        deadline = time.monotonic() + timeout
        with self._changed:
            waiting = set(self._open)
            while not waiting.isdisjoint(self._open):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True
