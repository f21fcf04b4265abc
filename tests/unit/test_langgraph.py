"""The LangGraph checkpointer over the in-process environment: a graph's checkpoints are
a run's committed `checkpoint` transitions, read back as LangGraph's own saver would
give them, large ones in parts, repeats recorded once."""

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from processor.client import InvalidArgument, Rejected
from processor.client import langgraph_records as lr
from processor.client.langgraph import RunstateSaver
from processor.testing import RunstateEnvironment
from tests.examples import examples


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    blob: str


def graph_of(saver: Any, calls: list[str], fail_at: str | None = None) -> Any:
    def node(name: str) -> Any:
        def run(state: State) -> dict[str, Any]:
            calls.append(name)
            if name == fail_at:
                raise RuntimeError(f"{name} crashed")
            return {"log": [name]}

        return run

    builder = StateGraph(State)
    for name in ("plan", "act", "report"):
        builder.add_node(name, node(name))
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "act")
    builder.add_edge("act", "report")
    builder.add_edge("report", END)
    return builder.compile(checkpointer=saver)


def thread(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def test_a_graph_runs_and_its_thread_is_a_committed_run() -> None:
    env = RunstateEnvironment()
    client = env.blocking_client()
    saver = RunstateSaver(client)
    calls: list[str] = []
    result = graph_of(saver, calls).invoke({"log": [], "blob": ""}, thread("t-1"))
    assert result["log"] == ["plan", "act", "report"]
    snapshot = client.snapshot("langgraph:t-1")
    assert snapshot is not None and snapshot.state == "running"
    history = client.history("langgraph:t-1")
    assert [t.event for t in history][:2] == ["create", "start"]
    assert all(t.principal.authority == "runtime" for t in history)
    # LangGraph's own view: the same states and history as its in-memory saver gives.
    memory = InMemorySaver()
    graph_of(memory, []).invoke({"log": [], "blob": ""}, thread("t-1"))
    ours = [c.checkpoint["channel_values"] for c in saver.list(thread("t-1"))]
    theirs = [c.checkpoint["channel_values"] for c in memory.list(thread("t-1"))]
    assert ours == theirs
    assert [c.metadata["step"] for c in saver.list(thread("t-1"))] == [
        c.metadata["step"] for c in memory.list(thread("t-1"))
    ]
    latest = saver.get_tuple(thread("t-1"))
    assert latest is not None and latest.parent_config is not None
    assert next(c.config for c in saver.list(thread("t-1"), limit=2)) == latest.config
    before = list(saver.list(thread("t-1"), before=latest.config))
    assert latest.config not in [c.config for c in before] and len(before) == 4
    assert next(iter(saver.list(thread("t-1"), filter={"step": 1}))).metadata["step"] == 1
    assert saver.get_tuple(thread("nobody")) is None


def test_a_crashed_node_resumes_from_the_last_checkpoint_without_rerunning_the_rest() -> None:
    env = RunstateEnvironment()
    saver = RunstateSaver(env.blocking_client())
    calls: list[str] = []
    with pytest.raises(RuntimeError, match="act crashed"):
        graph_of(saver, calls, fail_at="act").invoke({"log": [], "blob": ""}, thread("t-2"))
    # A new process: a new saver and graph on the same thread continue where it stopped.
    again: list[str] = []
    fresh = RunstateSaver(env.blocking_client())
    result = graph_of(fresh, again).invoke(None, thread("t-2"))
    assert calls == ["plan", "act"] and again == ["act", "report"]
    assert result["log"] == ["plan", "act", "report"]


def test_an_interrupt_waits_and_a_resume_continues() -> None:
    env = RunstateEnvironment()
    saver = RunstateSaver(env.blocking_client())

    def ask(state: State) -> dict[str, Any]:
        answer = interrupt("approve?")
        return {"log": [f"answer:{answer}"]}

    builder = StateGraph(State)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=saver)
    first = graph.invoke({"log": [], "blob": ""}, thread("t-3"))
    assert "__interrupt__" in first
    pending = saver.get_tuple(thread("t-3"))
    assert pending is not None and any(
        w[1] == "__interrupt__" for w in pending.pending_writes or []
    )
    done = graph.invoke(Command(resume="yes"), thread("t-3"))
    assert done["log"] == ["answer:yes"]


def test_a_checkpoint_over_the_runs_limit_goes_in_parts() -> None:
    env = RunstateEnvironment()
    client = env.blocking_client()
    saver = RunstateSaver(client)
    big = "x" * 300_000  # far past a run's 64 KiB checkpoint
    result = graph_of(saver, []).invoke({"log": [], "blob": big}, thread("t-4"))
    assert result["blob"] == big
    latest = saver.get_tuple(thread("t-4"))
    assert latest is not None and latest.checkpoint["channel_values"]["blob"] == big
    kinds = [t.payload["data"][lr.KEY]["kind"] for t in client.history("langgraph:t-4")[2:]]
    assert "part" in kinds and "parts" in kinds


def test_a_repeated_put_is_recorded_once() -> None:
    env = RunstateEnvironment()
    client = env.blocking_client()
    saver = RunstateSaver(client)
    graph_of(saver, []).invoke({"log": [], "blob": ""}, thread("t-5"))
    latest = saver.get_tuple(thread("t-5"))
    assert latest is not None and latest.parent_config is not None
    count = len(client.history("langgraph:t-5"))
    # What a process that crashed after sending, and sends again, does.
    again = RunstateSaver(env.blocking_client())
    again.put(latest.parent_config, latest.checkpoint, latest.metadata, {})
    again.put_writes(latest.config, [("log", ["late"])], "task-1")
    again.put_writes(latest.config, [("log", ["other"])], "task-1")  # first write stands
    assert len(client.history("langgraph:t-5")) == count + 1
    found = again.get_tuple(latest.config)
    assert found is not None and found.pending_writes == [("task-1", "log", ["late"])]


def test_the_async_api_with_an_async_client() -> None:
    env = RunstateEnvironment()
    saver = RunstateSaver(env.client())

    async def main() -> list[int]:
        result = await graph_of(saver, []).ainvoke({"log": [], "blob": ""}, thread("t-6"))
        assert result["log"] == ["plan", "act", "report"]
        with pytest.raises(InvalidArgument, match="thread id"):
            await saver.aget_tuple({"configurable": {}})
        return [c.metadata["step"] async for c in saver.alist(thread("t-6"), limit=2)]

    assert asyncio.run(main()) == [3, 2]
    with pytest.raises(InvalidArgument, match="async API"):
        saver.get_tuple(thread("t-6"))


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.binary(max_size=150_000), min_size=1, max_size=3),
    st.text(max_size=40),
)
def test_any_records_read_back_as_sent_whole_or_in_parts(blobs: list[bytes], ns: str) -> None:
    sent: list[dict[str, Any]] = []
    for index, blob in enumerate(blobs):
        pid, record = lr.checkpoint_record(ns, f"c{index}", None, ("bytes", blob), ("json", b"{}"))
        for _, data in lr.proposals(pid, record):
            assert len(rfc8785.dumps(data)) <= lr.CHECKPOINT_MAX_BYTES
            sent.append(data)
    thread_ = lr.thread_of(sent)
    assert [s.checkpoint for s in thread_.checkpoints[ns].values()] == [
        ("bytes", blob) for blob in blobs
    ]


def test_another_key_holder_cannot_put_a_checkpoint_into_the_thread() -> None:
    env = RunstateEnvironment()
    saver = RunstateSaver(env.blocking_client("runtime"))
    graph_of(saver, []).invoke({"log": [], "blob": ""}, thread("t-7"))
    honest = saver.get_tuple(thread("t-7"))
    assert honest is not None
    # A tool executor may record checkpoints in the run (a step authority): it forges a
    # newer checkpoint, and writes for the current one.
    forged = dict(honest.checkpoint)
    forged["id"] = "f" * 36
    forged["channel_values"] = {"log": ["forged"], "blob": ""}
    pid, record = lr.checkpoint_record(
        "", forged["id"], None, saver.serde.dumps_typed(forged), ("json", b"{}")
    )
    tool = env.blocking_client("tool")
    outcome = tool.propose_and_wait(
        "langgraph:t-7", "checkpoint", payload={"data": {lr.KEY: record}}, proposal_id=pid
    )
    assert outcome.event == "checkpoint"  # type: ignore[union-attr]  # committed in the run
    after = saver.get_tuple(thread("t-7"))
    assert after is not None and after.config == honest.config
    assert after.checkpoint["channel_values"] == honest.checkpoint["channel_values"]


def test_a_thread_whose_run_someone_else_created_is_refused() -> None:
    env = RunstateEnvironment()
    # Another principal with the runtime authority made the run first.
    env.blocking_client("operator").create_and_wait("langgraph:t-8", "run_state")
    saver = RunstateSaver(env.blocking_client("runtime"))
    with pytest.raises(Rejected, match="already exists"):
        graph_of(saver, []).invoke({"log": [], "blob": ""}, thread("t-8"))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.one_of(json_values, st.builds(lambda r: {lr.KEY: r}, json_values))))
def test_any_history_reads_as_a_thread_never_an_error(datas: list[Any]) -> None:
    valid = lr.checkpoint_record("", "c1", None, ("json", b"{}"), ("json", b"{}"))[1]
    thread_ = lr.thread_of([*datas, {lr.KEY: valid}, *datas])
    assert "c1" in thread_.checkpoints[""]
