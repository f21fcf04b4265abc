"""A coroutine run inline up to its first wait (the Faust fetch loop's deliveries)."""

import asyncio

import pytest

from processor.runtimes.faust.inline import finish, start_inline


class _BareYield:
    def __await__(self):  # type: ignore[no-untyped-def]
        yield


def test_a_coroutine_that_never_waits_runs_to_its_end_inline() -> None:
    done: list[str] = []

    async def deliver() -> None:
        done.append("put")

    async def main() -> None:
        assert start_inline(deliver()) is None
        assert done == ["put"]  # no task, no turn of the loop

    asyncio.run(main())


def test_a_coroutine_that_waits_is_finished_by_its_own_task() -> None:
    async def main() -> list[str]:
        seen: list[str] = []
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        queue.put_nowait(0)  # full: the next put waits

        async def deliver() -> None:
            seen.append("before")
            await queue.put(1)
            await _BareYield()  # one turn of the loop: a bare yield of None
            seen.append("after")

        coro = deliver()
        waiting = start_inline(coro)
        assert waiting is not None and seen == ["before"]
        task = asyncio.ensure_future(finish(coro, waiting))
        assert not task.done()
        assert queue.get_nowait() == 0  # room: the put goes through
        await task
        assert queue.get_nowait() == 1
        return seen

    assert asyncio.run(main()) == ["before", "after"]


def test_a_finish_cancelled_cancels_the_coroutine_where_it_waits() -> None:
    """The fetch loop gives a waiting delivery up when the flow is suspended: its
    cancellation reaches the coroutine at its wait (its cleanup runs, and a queue's
    put that was waiting leaves nothing behind)."""

    async def main() -> tuple[list[str], int]:
        seen: list[str] = []
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        queue.put_nowait(0)

        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        at_put = asyncio.Event()

        async def deliver() -> None:
            await gate  # where start_inline leaves it
            at_put.set()
            try:
                await queue.put(1)
                seen.append("put")
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        coro = deliver()
        waiting = start_inline(coro)
        assert waiting is not None
        task = asyncio.ensure_future(finish(coro, waiting))
        gate.set_result(None)
        await asyncio.wait_for(at_put.wait(), 5)  # finish drives it; it waits at the put
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        queue.get_nowait()
        return seen, queue.qsize()

    assert asyncio.run(main()) == (["cancelled"], 0)


def test_errors_come_out_where_they_would_have() -> None:
    async def fails_at_once() -> None:
        raise ValueError("at once")

    async def fails_after_waiting(future: "asyncio.Future[None]") -> None:
        await future

    async def main() -> None:
        with pytest.raises(ValueError, match="at once"):
            start_inline(fails_at_once())
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        coro = fails_after_waiting(future)
        waiting = start_inline(coro)
        assert waiting is not None
        future.set_exception(KeyError("later"))
        with pytest.raises(KeyError, match="later"):
            await finish(coro, waiting)

    asyncio.run(main())
