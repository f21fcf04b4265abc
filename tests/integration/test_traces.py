"""One trace across the hop: the agent's spans (the SDK, recorded in memory) and a
worker's (either runtime, `--traces file`) join into one trace per proposal: propose,
then the worker's decide and commit as children of it, and the agent's outcome."""

from pathlib import Path
from typing import Any

import pytest

from processor.kafka.topics import TopicNames
from schemas.messages import Rejection, Transition
from tests.integration.harness import Env, WorkerProcess, eventually, make_env
from tests.tracing import agent_spans, file_spans, hex_id


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


@pytest.mark.parametrize("runtime", ["native", "faust"])
def test_the_agents_and_the_workers_spans_are_one_trace(env: Env, runtime: str) -> None:
    path = env.tmp / "worker-spans.jsonl"
    worker = WorkerProcess(
        env, env.tmp / "w1", "--traces", "file", "--traces-file", str(path), runtime=runtime
    )
    try:
        worker.wait_ready(partitions=3)
        run_id = f"traced-{runtime}"
        with agent_spans() as exporter:
            client = env.client()
            try:
                created = client.create_and_wait(run_id, "task_lifecycle")
                refused = client.propose_and_wait(run_id, "finish")  # not from `created`
            finally:
                client.close()
            agent = exporter.get_finished_spans()
        assert isinstance(created, Transition) and isinstance(refused, Rejection)

        def decided() -> list[dict[str, Any]] | None:
            spans = file_spans(path)
            return spans if len(spans) >= 4 else None

        spans = eventually("the worker's decide and commit spans", decided)
    finally:
        assert worker.terminate() == 0, worker.log()

    proposes = [s for s in agent if s.name == "runstate propose"]
    outcomes = [s for s in agent if s.name == "runstate outcome"]
    assert len(proposes) == len(outcomes) == 2
    for propose, outcome, answer in zip(proposes, outcomes, (created, refused), strict=True):
        trace_id = hex_id(propose.context.trace_id, 32)
        span_id = hex_id(propose.context.span_id, 16)
        assert outcome.parent is not None and outcome.parent.span_id == propose.context.span_id
        (decide,) = [
            s for s in spans if s["name"] == "runstate decide" and s["parent_id"] == span_id
        ]
        (commit,) = [s for s in spans if s["parent_id"] == decide["context"]["span_id"]]
        assert commit["name"] == "runstate commit"
        assert decide["context"]["trace_id"] == commit["context"]["trace_id"] == trace_id
        assert commit["status"]["status_code"] == "UNSET"
        said = decide["attributes"]
        assert said["runstate.proposal_id"] == answer.proposal_id
        assert outcome.attributes["runstate.proposal_id"] == answer.proposal_id
        if isinstance(answer, Rejection):
            assert said["runstate.rejection.code"] == answer.code.value
            assert outcome.attributes["runstate.rejection.code"] == answer.code.value
        else:
            assert said["runstate.state"] == answer.to_state
        assert said["messaging.destination.name"] == env.topics.proposals
