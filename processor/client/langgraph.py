"""A LangGraph checkpointer backed by runstate (`pip install 'runstate[langgraph]'`):

    saver = RunstateSaver(client)        # a RunstateClient, or an AsyncRunstateClient
    graph = builder.compile(checkpointer=saver)
    graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}})

A thread is a run (`run_prefix` + thread id) of the `run_state` machine, created and
started at its first checkpoint by the client's principal (a runtime key). Every
`put` and `put_writes` is a `checkpoint` proposal of that run, signed, decided by the
workers and committed exactly once; `get_tuple` and `list` read the thread back from the
run's history, taking only the records of the principal that created the run. So a
graph's progress has an owner, an audit trail, a hash chain and
the workers' retention, and a graph killed mid-step resumes from its last committed
checkpoint on any machine. Records too large for one checkpoint go in parts
(`langgraph_records`).

LangGraph's default durability ("async") saves a checkpoint while the next node runs, so
a kill can lose the last one and that node runs again; `durability="sync"` (an argument of
`invoke`/`stream`) commits each checkpoint before the next node starts.

Reads rebuild the thread from its whole history, once per call: fine for threads of
hundreds of steps, not for very long ones. A thread cannot be deleted (the history is
the record); `list` needs a thread id.
"""

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from schemas.codes import RejectionCode
from schemas.messages import Rejection, Transition

from . import langgraph_records as lr
from .aio import AsyncRunstateClient
from .errors import InvalidArgument, Rejected
from .sync import RunstateClient

#: The (proposal id, checkpoint data) of a call, in the order they are sent.
Sent = list[tuple[str, dict[str, Any]]]


class RunstateSaver(BaseCheckpointSaver[int]):
    """LangGraph's `BaseCheckpointSaver` over runstate runs (see the module).

    `client`: signs with a key of the machine's step authorities (`runtime`). With a
    `RunstateClient` both the sync and the async graph APIs work (async calls run in a
    thread); with an `AsyncRunstateClient`, the async API only (`ainvoke`, `astream`).
    `timeout`: seconds each proposal may take to be decided."""

    def __init__(
        self,
        client: RunstateClient | AsyncRunstateClient,
        *,
        run_prefix: str = "langgraph:",
        machine: str = "run_state",
        timeout: float = 30.0,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.client = client
        self.run_prefix = run_prefix
        self.machine = machine
        self.timeout = timeout
        self._started: set[str] = set()
        # LangGraph calls a saver from several threads (or tasks) at once; a client
        # waits for one proposal id once, so the saver sends one record at a time.
        self._sending = threading.Lock()
        self._asending: asyncio.Lock | None = None

    # -- the records of a call ----------------------------------------------------------
    def run_id(self, config: RunnableConfig) -> str:
        configurable = config.get("configurable") or {}
        thread_id = configurable.get("thread_id")
        if thread_id is None or thread_id == "":
            raise InvalidArgument(
                'a runstate checkpointer needs a thread id: {"configurable": {"thread_id": ...}}'
            )
        return f"{self.run_prefix}{thread_id}"

    def _put_records(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
    ) -> tuple[RunnableConfig, Sent]:
        configurable = config["configurable"]
        ns = str(configurable.get("checkpoint_ns", ""))
        pid, record = lr.checkpoint_record(
            ns,
            checkpoint["id"],
            configurable.get("checkpoint_id"),
            self.serde.dumps_typed(checkpoint),
            self.serde.dumps_typed(get_checkpoint_metadata(config, metadata)),
        )
        saved: RunnableConfig = {
            "configurable": {
                "thread_id": configurable["thread_id"],
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }
        return saved, lr.proposals(pid, record)

    def _writes_records(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, path: str
    ) -> Sent:
        configurable = config["configurable"]
        pid, record = lr.writes_record(
            str(configurable.get("checkpoint_ns", "")),
            str(configurable["checkpoint_id"]),
            task_id,
            path,
            [
                (channel, WRITES_IDX_MAP.get(channel, index), self.serde.dumps_typed(value))
                for index, (channel, value) in enumerate(writes)
            ],
        )
        return lr.proposals(pid, record)

    def _tuple(
        self, thread: lr.Thread, config: RunnableConfig, checkpoint_id: str | None
    ) -> CheckpointTuple | None:
        configurable = config["configurable"]
        ns = str(configurable.get("checkpoint_ns", ""))
        found = checkpoint_id or thread.latest(ns)
        saved = thread.checkpoints.get(ns, {}).get(found) if found is not None else None
        if found is None or saved is None:
            return None
        thread_id = configurable["thread_id"]

        def at(cid: str) -> RunnableConfig:
            return {
                "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}
            }

        return CheckpointTuple(
            config=at(found),
            checkpoint=self.serde.loads_typed(saved.checkpoint),
            metadata=self.serde.loads_typed(saved.metadata),
            parent_config=at(saved.parent) if saved.parent else None,
            pending_writes=[
                (task, channel, self.serde.loads_typed(value))
                for task, channel, value, _ in thread.pending_writes(ns, found)
            ],
        )

    def _listed(
        self,
        thread: lr.Thread,
        config: RunnableConfig,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Iterator[CheckpointTuple]:
        configurable = config["configurable"]
        wanted_ns = configurable.get("checkpoint_ns")
        wanted_id = get_checkpoint_id(config)
        before_id = get_checkpoint_id(before) if before else None
        left = limit
        for ns, saved in thread.checkpoints.items():
            if wanted_ns is not None and ns != wanted_ns:
                continue
            for cid in sorted(saved, reverse=True):
                if (wanted_id and cid != wanted_id) or (before_id and cid >= before_id):
                    continue
                scoped: RunnableConfig = {
                    "configurable": {**configurable, "checkpoint_ns": ns, "checkpoint_id": cid}
                }
                found = self._tuple(thread, scoped, cid)
                if found is None:
                    continue
                if filter and not all(found.metadata.get(k) == v for k, v in filter.items()):
                    continue
                if left is not None:
                    if left <= 0:
                        return
                    left -= 1
                yield found

    @staticmethod
    def _settled(outcome: Any, pid: str, *, first_stands: bool = False) -> None:
        """A record's outcome: committed, now or before (the same id answers with the
        transition it committed); with `first_stands`, also a record of the same id
        committed before with other content. Anything else is raised: `Rejected`."""
        if isinstance(outcome, Transition):
            return
        reused = isinstance(outcome, Rejection) and outcome.code is RejectionCode.PROPOSAL_ID_REUSED
        if first_stands and reused:
            return
        if isinstance(outcome, Rejection):
            raise Rejected(outcome)
        raise InvalidArgument(f"proposal {pid}: unexpected outcome {type(outcome).__name__}")

    def _sync(self) -> RunstateClient:
        if not isinstance(self.client, RunstateClient):
            raise InvalidArgument(
                "this RunstateSaver has an AsyncRunstateClient: use the graph's async API "
                "(ainvoke, astream), or give the saver a RunstateClient"
            )
        return self.client

    # -- sync ---------------------------------------------------------------------------
    def _ensure_run(self, run_id: str) -> None:
        if run_id in self._started:
            return
        client = self._sync()
        self._settled(
            client.create_and_wait(
                run_id, self.machine, proposal_id="langgraph:create", timeout=self.timeout
            ),
            "langgraph:create",
        )
        self._settled(
            client.propose_and_wait(
                run_id, "start", proposal_id="langgraph:start", timeout=self.timeout
            ),
            "langgraph:start",
        )
        self._started.add(run_id)

    def _send(self, run_id: str, sent: Sent, first_stands: bool = False) -> None:
        client = self._sync()
        with self._sending:
            self._ensure_run(run_id)
            for pid, data in sent:
                outcome = client.propose_and_wait(
                    run_id,
                    "checkpoint",
                    payload={"data": data},
                    proposal_id=pid,
                    timeout=self.timeout,
                )
                self._settled(outcome, pid, first_stands=first_stands)

    def _thread(self, run_id: str) -> lr.Thread:
        return _thread_of(self._sync().history(run_id))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread = self._thread(self.run_id(config))
        return self._tuple(thread, config, get_checkpoint_id(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        if config is None:
            raise InvalidArgument("a runstate checkpointer lists one thread: give its thread_id")
        thread = self._thread(self.run_id(config))
        yield from self._listed(thread, config, filter, before, limit)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        saved, sent = self._put_records(config, checkpoint, metadata)
        self._send(self.run_id(config), sent)
        return saved

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        records = self._writes_records(config, writes, task_id, task_path)
        self._send(self.run_id(config), records, first_stands=True)

    # -- async --------------------------------------------------------------------------
    async def _aensure_run(self, client: AsyncRunstateClient, run_id: str) -> None:
        if run_id in self._started:
            return
        self._settled(
            await client.create_and_wait(
                run_id, self.machine, proposal_id="langgraph:create", timeout=self.timeout
            ),
            "langgraph:create",
        )
        self._settled(
            await client.propose_and_wait(
                run_id, "start", proposal_id="langgraph:start", timeout=self.timeout
            ),
            "langgraph:start",
        )
        self._started.add(run_id)

    async def _asend(self, run_id: str, sent: Sent, first_stands: bool = False) -> None:
        client = self.client
        if not isinstance(client, AsyncRunstateClient):
            await asyncio.to_thread(self._send, run_id, sent, first_stands)
            return
        if self._asending is None:
            self._asending = asyncio.Lock()
        async with self._asending:
            await self._aensure_run(client, run_id)
            for pid, data in sent:
                outcome = await client.propose_and_wait(
                    run_id,
                    "checkpoint",
                    payload={"data": data},
                    proposal_id=pid,
                    timeout=self.timeout,
                )
                self._settled(outcome, pid, first_stands=first_stands)

    async def _athread(self, run_id: str) -> lr.Thread:
        client = self.client
        if not isinstance(client, AsyncRunstateClient):
            return await asyncio.to_thread(self._thread, run_id)
        return _thread_of(await client.history(run_id))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread = await self._athread(self.run_id(config))
        return self._tuple(thread, config, get_checkpoint_id(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        if config is None:
            raise InvalidArgument("a runstate checkpointer lists one thread: give its thread_id")
        thread = await self._athread(self.run_id(config))
        for found in self._listed(thread, config, filter, before, limit):
            yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        saved, sent = self._put_records(config, checkpoint, metadata)
        await self._asend(self.run_id(config), sent)
        return saved

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        records = self._writes_records(config, writes, task_id, task_path)
        await self._asend(self.run_id(config), records, first_stands=True)


def _thread_of(history: Sequence[Transition]) -> lr.Thread:
    """The thread in a run's history: the checkpoints of the principal that created the
    run. Another key holder allowed to propose to the run cannot put a checkpoint or a
    write into the thread (LangGraph would resume from it)."""
    if not history:
        return lr.Thread()
    owner = history[0].principal
    return lr.thread_of(
        t.payload.get("data") for t in history if t.event == "checkpoint" and t.principal == owner
    )


__all__ = ["RunstateSaver"]
