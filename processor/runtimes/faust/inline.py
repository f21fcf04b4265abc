"""A coroutine run on the caller's task up to its first wait, and only then as a task.

Faust's fetch loop hands each record to the conductor as a task of its own, awaited
beside the flow's suspension (`Service.wait_first`: four futures and an
`asyncio.wait` a record), which cost about a fifth of the Faust worker's main thread.
The conductor's callback almost never waits: it puts the record into the agent's
queue. `start_inline` runs it here; what does wait (a full queue, the flow suspended)
is finished by `finish`, which the caller runs as Faust would have run the whole.
"""

import asyncio
from collections.abc import Coroutine
from typing import Any


def start_inline(coro: Coroutine[Any, Any, Any]) -> "_Waiting | None":
    """Run `coro` up to its first wait: None when it finished, or what it waits for
    (hand it to `finish`). Its exception, if it raised, is raised here."""
    try:
        waiting = coro.send(None)
    except StopIteration:
        return None
    return _Waiting(waiting)


class _Waiting:
    """What a coroutine yielded when it first waited (a future, or None for a bare
    yield), kept apart from a finished coroutine's None."""

    __slots__ = ("what",)

    def __init__(self, what: Any) -> None:
        self.what = what


async def finish(coro: Coroutine[Any, Any, Any], waiting: "_Waiting") -> None:
    """Drive `coro`, which `start_inline` left at `waiting`, to its end as its task
    would: each future it yields awaited here, its outcome sent (or thrown) back in; a
    cancellation of this task is thrown into it, and it is closed if it does not end."""
    what = waiting.what
    try:
        while True:
            try:
                if what is None:
                    await asyncio.sleep(0)
                else:
                    # A task takes the flag down when it receives a future; awaiting one
                    # that still has it up raises "await wasn't used with future".
                    what._asyncio_future_blocking = False
                    await what
            except BaseException as exc:  # its future's error, or this task cancelled
                what = coro.throw(exc)
            else:
                what = coro.send(None)
    except StopIteration:
        return
    finally:
        coro.close()  # (a coroutine already finished is left as it is)
