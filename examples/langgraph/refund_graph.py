"""A LangGraph graph whose checkpoints are a runstate run: killed mid-node, run again, it
goes on from its last committed checkpoint.

    python examples/langgraph/refund_graph.py THREAD_ID [--crash-in NODE]

Three nodes (validate, refund, notify) in a line. The graph is compiled with
`RunstateSaver`, so after each node LangGraph's checkpoint is a `checkpoint` proposal of
the run `langgraph:THREAD_ID`, signed and committed exactly once by the workers. Run
again with the same thread id, the graph reads its thread back from the run's history
and runs only the nodes it had not finished.

`--crash-in NODE` kills the process (SIGKILL, no cleanup) while NODE runs, to show it.

Settings, as for every runstate command: RUNSTATE_BOOTSTRAP_SERVERS, RUNSTATE_TOPIC_PREFIX,
RUNSTATE_WORKER_URL (the worker's HTTP API, for the thread's history),
RUNSTATE_SIGNING_KEY_FILE (a key with the runtime authority), RUNSTATE_HTTP_TOKEN.
Prints one JSON line per node it runs, then the final state.
"""

import argparse
import itertools
import json
import operator
import os
import signal
from pathlib import Path
from typing import Annotated, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from processor.client import KafkaSettings, RunstateClient, TopicNames, load_signing_key
from processor.client.langgraph import RunstateSaver

NODES = ("validate", "refund", "notify")


class Refund(TypedDict):
    order: str
    done: Annotated[list[str], operator.add]


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


class Node:
    """One node: says it runs, and kills the process when it is the one to crash in."""

    def __init__(self, name: str, crash_in: str | None) -> None:
        self.name, self.crash_in = name, crash_in

    def __call__(self, state: Refund) -> dict[str, list[str]]:
        say(event="node", node=self.name, order=state["order"])
        if self.name == self.crash_in:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"done": [self.name]}


def build(saver: RunstateSaver, crash_in: str | None) -> CompiledStateGraph[Refund]:
    builder = StateGraph(Refund)
    for name in NODES:
        builder.add_node(name, Node(name, crash_in))
    builder.add_edge(START, NODES[0])
    for before, after in itertools.pairwise(NODES):
        builder.add_edge(before, after)
    builder.add_edge(NODES[-1], END)
    return builder.compile(checkpointer=saver)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("thread_id")
    parser.add_argument("--crash-in", choices=NODES, default=None)
    args = parser.parse_args()
    env = os.environ
    client = RunstateClient(
        KafkaSettings(env.get("RUNSTATE_BOOTSTRAP_SERVERS", "127.0.0.1:9092")),
        TopicNames.with_prefix(env.get("RUNSTATE_TOPIC_PREFIX", "runstate.")),
        signing_key=load_signing_key(Path(env["RUNSTATE_SIGNING_KEY_FILE"])),
        worker_urls=[env.get("RUNSTATE_WORKER_URL", "http://127.0.0.1:8080")],
    )
    with client:
        saver = RunstateSaver(client)
        graph = build(saver, args.crash_in)
        config: RunnableConfig = {"configurable": {"thread_id": args.thread_id}}
        # A thread with a checkpoint goes on from it (None: no new input).
        started = saver.get_tuple(config) is not None
        first: Refund | None = None if started else {"order": args.thread_id, "done": []}
        # durability="sync": each checkpoint is committed before the next node starts, so
        # a node that finished is never run again.
        final = graph.invoke(first, config, durability="sync")
        say(event="finished", resumed=started, done=final["done"])


if __name__ == "__main__":
    main()
