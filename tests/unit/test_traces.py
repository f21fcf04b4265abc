"""Traces: the agent's propose span's context crosses in the proposal's headers, so the
worker's decide and commit spans join the agent's trace; untrusted or malformed trace
headers never fail a record; nothing is traced unless configured."""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from processor.observe import traces
from processor.testing import RunstateEnvironment
from schemas.messages import Rejection, Transition
from tests.examples import examples
from tests.tracing import agent_spans, file_spans, hex_id


@pytest.fixture
def worker_file(tmp_path: Path) -> Iterator[Path]:
    """A worker's tracer writing to a file, for the test's length."""
    path = tmp_path / "spans.jsonl"
    assert traces.configure_worker("file", path, "runstate-worker", "w-1") is None
    try:
        yield path
    finally:
        traces.configure_worker("off", None, "runstate-worker", None)


def test_nothing_is_traced_unless_configured(tmp_path: Path) -> None:
    headers, span = traces.proposed("r-1", "start", "p-1", "proposals")
    assert (headers, span) == ([], None)  # no tracer provider: no headers, no span
    assert not traces.tracing()
    assert (
        traces.decided(
            [("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")],
            "proposals",
            0,
            0,
            object(),
            0,
        )
        is None
    )


def test_one_trace_from_propose_through_decide_and_commit_to_outcome(worker_file: Path) -> None:
    with agent_spans() as exporter:
        client = RunstateEnvironment().blocking_client("runtime")
        outcome = client.create_and_wait("r-1", "run_state")
        assert isinstance(outcome, Transition)
        propose, waited = exporter.get_finished_spans()
        record = client._record("r-1", "start")  # the headers a worker reads
    assert (propose.name, waited.name) == ("runstate propose", "runstate outcome")
    assert waited.parent is not None and waited.parent.span_id == propose.context.span_id
    assert waited.attributes["runstate.outcome"] == "Transition"
    assert waited.attributes["runstate.revision"] == outcome.revision == 0
    assert propose.attributes["runstate.run_id"] == "r-1"

    headers = dict(record.headers)
    assert set(headers) >= {"traceparent"}
    began = 1
    decision = traces.decided(record.headers, "proposals", 3, 42, outcome, began)
    assert decision is not None
    traces.committed([decision], began)
    traces.committed([decision], began, error="aborted")
    worker = file_spans(worker_file)
    assert [s["name"] for s in worker] == ["runstate decide", "runstate commit", "runstate commit"]
    decide, commit, aborted = worker
    trace_id = record_trace_id(headers["traceparent"])
    assert {s["context"]["trace_id"] for s in worker} == {trace_id}
    assert decide["parent_id"] == traceparent_span_id(headers["traceparent"])
    assert commit["parent_id"] == decide["context"]["span_id"]
    assert decide["attributes"]["messaging.kafka.offset"] == 42
    assert decide["attributes"]["runstate.outcome"] == "Transition"
    assert decide["resource"]["attributes"]["service.instance.id"] == "w-1"
    assert aborted["status"]["status_code"] == "ERROR"


def test_a_rejection_names_its_code(worker_file: Path) -> None:
    with agent_spans() as exporter:
        outcome = (
            RunstateEnvironment().blocking_client("runtime").propose_and_wait("nobody", "start")
        )
        assert isinstance(outcome, Rejection)
        waited = [s for s in exporter.get_finished_spans() if s.name == "runstate outcome"]
    assert waited[0].attributes["runstate.rejection.code"] == outcome.code.value


def test_the_agents_current_span_is_the_parent() -> None:
    with agent_spans() as exporter:
        from opentelemetry import trace

        with trace.get_tracer("agent").start_as_current_span("agent step") as step:
            headers, _ = traces.proposed("r-1", "start", "p-1", "proposals")
        (propose,) = [s for s in exporter.get_finished_spans() if s.name == "runstate propose"]
    assert propose.parent is not None
    assert propose.parent.span_id == step.get_span_context().span_id
    assert dict(headers)["traceparent"].decode().split("-")[1] == f"{propose.context.trace_id:032x}"


header_names = st.sampled_from(["traceparent", "tracestate", "TRACEPARENT", "x"])
header_values = st.one_of(
    st.none(),
    st.binary(max_size=700),
    st.text(max_size=700),
    st.builds(
        lambda t, s, f: f"00-{t}-{s}-{f}".encode(),
        st.text("0123456789abcdef0", min_size=32, max_size=32),
        st.text("0123456789abcdef0", min_size=16, max_size=16),
        st.sampled_from(["00", "01", "ff", "zz"]),
    ),
)


VALID = b"00-00000000000000000000000000000001-0000000000000001-01"


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(st.tuples(header_names, header_values), max_size=6))
@example([("traceparent", VALID), ("tracestate", b"\x80")])
@example([("traceparent", VALID), ("tracestate", "k=" + "v" * 600)])
def test_any_trace_headers_give_a_span_or_none_never_an_error(
    tmp_path_factory: pytest.TempPathFactory, headers: list[tuple[str, Any]]
) -> None:
    path = tmp_path_factory.mktemp("spans") / "spans.jsonl"
    assert traces.configure_worker("file", path, "runstate-worker", None) is None
    try:
        decision = traces.decided(headers, "proposals", 0, 7, object(), 1)
        traces.committed([] if decision is None else [decision], 1)
    finally:
        traces.configure_worker("off", None, "runstate-worker", None)
    spans = file_spans(path)
    value = traceparent_of(headers)
    assert (decision is not None) == valid_traceparent(value)
    # A valid context whose flags say "not sampled" is followed: no span is recorded.
    recorded = decision is not None and value is not None and int(value.strip()[-2:], 16) & 1 == 1
    assert [s["name"] for s in spans] == (
        ["runstate decide", "runstate commit"] if recorded else []
    )
    if recorded:
        assert spans[0]["context"]["trace_id"] == record_trace_id(value)


def traceparent_of(headers: list[tuple[str, Any]]) -> bytes | None:
    """The value a worker reads: the first traceparent header with a value."""
    value = next((v for n, v in headers if n == "traceparent" and v is not None), None)
    return value.encode() if isinstance(value, str) else value


def valid_traceparent(value: bytes | None) -> bool:
    """The W3C rule: version, 32 hex trace id and 16 hex span id (neither all zeros),
    flags; version ff is invalid. A worker reads no header value over 512 characters."""
    try:
        text = (value or b"").decode("ascii")
    except UnicodeDecodeError:
        return False
    found = re.fullmatch(
        r"[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})[ \t]*", text
    )
    return (
        len(text) <= 512
        and found is not None
        and found[1] != "ff"
        and int(found[2], 16) != 0
        and int(found[3], 16) != 0
    )


def record_trace_id(traceparent: bytes) -> str:
    return hex_id(int(traceparent.decode().split("-")[1], 16), 32)


def traceparent_span_id(traceparent: bytes) -> str:
    return hex_id(int(traceparent.decode().split("-")[2], 16), 16)
