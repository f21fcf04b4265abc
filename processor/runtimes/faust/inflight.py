"""The Faust agent's batches whose outcomes are travelling, oldest first.

A batch's outcomes take two acknowledgement round trips (processing.py); waiting for
them before deciding the next batch left the agent idle for about a third of a drain.
So the agent decides the next batch meanwhile, against the table and what the batches
still travelling will write to it (`Staged`), and sends its records but the snapshots
at once. Its snapshots wait for the batch before it to be delivered and written
(`Decision.complete` awaits `last`), so batches end in the order they were decided, and
a crash at any point leaves what a crash inside one larger batch would.

At most `depth` batches travel; the agent waits for the oldest before deciding more.
A batch that fails fails every batch after it (each awaits the one before), and the
agent sees the first failure when it waits for room or drains: it then gives up the
rest (`abandon`), whose proposals are decided again when read again.
"""

import asyncio
from collections import deque
from collections.abc import Coroutine
from typing import Any

#: Batches travelling at once: one delivering its snapshots while the next is decided
#: and its other records sent.
DEPTH = 2


class InFlight:
    def __init__(self, depth: int = DEPTH) -> None:
        self.depth = depth
        self._tasks: deque[asyncio.Task[None]] = deque()

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    @property
    def last(self) -> "asyncio.Task[None] | None":
        """The newest batch: the next one's snapshots wait for it."""
        return self._tasks[-1] if self._tasks else None

    def add(self, completing: Coroutine[Any, Any, None]) -> None:
        """A batch's delivery, started now (call `room` first)."""
        self._tasks.append(asyncio.ensure_future(completing))

    async def room(self) -> None:
        """Wait until fewer than `depth` batches travel; a failed one's error is raised."""
        while len(self._tasks) >= self.depth:
            await self._oldest()

    async def drain(self) -> None:
        """Wait until every batch is delivered; the first failure is raised."""
        while self._tasks:
            await self._oldest()

    async def abandon(self) -> None:
        """Give up every batch still travelling (their outcomes may be partly sent: their
        proposals are decided again, to the same outcomes, as after a crash)."""
        tasks = list(self._tasks)
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _oldest(self) -> None:
        task = self._tasks[0]
        try:
            await asyncio.shield(task)  # a cancelled waiter leaves the batch to `abandon`
        finally:
            if task.done() and self._tasks and self._tasks[0] is task:
                self._tasks.popleft()
