"""Watches of a `RunstateEnvironment`: its transitions in commit order, as the SDK's
watches give a topic's. Position {0: n}: the watch goes on from the n-th transition
committed. The async watch waits for new transitions (other tasks of the loop propose
them); the blocking one, in a single thread where nothing else can commit, gives what
is committed and ends."""

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING

from processor.client.watch import AsyncWatch, Position, Watch
from schemas.messages import Transition

if TYPE_CHECKING:
    from .environment import RunstateEnvironment


class LogWatch(Watch):
    def __init__(
        self,
        env: "RunstateEnvironment",
        select: Callable[[Transition], bool],
        start: int,
        resume_from: Position | None,
    ) -> None:
        """The transitions `select` keeps from the `start`-th committed on, or from
        `resume_from`."""
        self._env = env
        self._select = select
        self.position = {0: (resume_from or {}).get(0, start)}

    def poll(self, timeout: float = 0.0) -> Transition | None:
        log = self._env.log
        while self.position[0] < len(log):
            transition = log[self.position[0]]
            self.position[0] += 1
            if self._select(transition):
                return transition
        return None

    def __iter__(self) -> Iterator[Transition]:
        while (found := self.poll()) is not None:
            yield found

    def close(self) -> None:
        return None


class AsyncLogWatch(AsyncWatch):
    def __init__(self, env: "RunstateEnvironment", watch: LogWatch) -> None:
        super().__init__(lambda: watch)
        self._env = env
        self._log_watch = watch
        self._watch = watch

    async def __aiter__(self) -> AsyncIterator[Transition]:
        while True:
            found = self._log_watch.poll()
            if found is not None:
                yield found
                continue
            committed = asyncio.Event()  # set by the environment's next commit
            self._env.waiting.append(committed)
            await committed.wait()

    async def close(self) -> None:
        return None


def run_log_watch(
    env: "RunstateEnvironment", run_id: str, resume_from: Position | None, since_ms: int | None
) -> LogWatch:
    """Run `run_id`'s transitions, from its first (or the first at `since_ms` or later)."""
    start = next(
        (n for n, t in enumerate(env.log) if since_ms is None or t.at_ms >= since_ms),
        len(env.log),
    )
    return LogWatch(env, lambda t: t.run_id == run_id, start, resume_from)


def state_log_watch(
    env: "RunstateEnvironment", state: str, machine: str | None, resume_from: Position | None
) -> LogWatch:
    """The transitions into `state` committed from now on."""
    return LogWatch(
        env,
        lambda t: t.to_state == state and (machine is None or t.machine == machine),
        len(env.log),
        resume_from,
    )
