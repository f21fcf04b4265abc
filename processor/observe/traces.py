"""OpenTelemetry traces of proposals: one trace from the agent's propose, through a
worker's decide and commit, to the agent's outcome. The trace crosses Kafka in the W3C
trace context headers of the proposal record (`traceparent`, `tracestate`), added after
the signature (which covers the key and value, not these headers).

Off unless configured, and then nearly free: without `opentelemetry-api` installed
nothing here does anything; the SDK's spans record when the application has set a tracer
provider (its own, as for any instrumented library), a worker's when started with
`--traces` (`configure_worker`). The trace context is untrusted input: it links spans and
never decides anything; a malformed one is ignored.
"""

import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import IO, Any, Literal

try:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `traces` extra is not installed: every call is a no-op
    trace = None  # type: ignore[assignment]

from processor.records.intake import Headers, header_value

#: The instrumentation scope of every span here.
SCOPE = "runstate"
#: The record headers that carry the trace context (W3C Trace Context).
TRACE_HEADERS = ("traceparent", "tracestate")
#: The longest header value read: a traceparent is 55 characters, a tracestate at most
#: 512; anything longer is not a trace context.
MAX_HEADER_CHARS = 512

_PROPAGATOR: Any = TraceContextTextMapPropagator() if trace is not None else None
#: The worker's tracer, once `configure_worker` set one (None: a worker traces nothing).
_worker_tracer: Any = None

TraceMode = Literal["off", "otlp", "file"]


# -- in the agent (the SDK) ------------------------------------------------------------
def proposed(
    run_id: str, event: str, proposal_id: str, topic: str
) -> tuple[list[tuple[str, str | bytes | None]], Any]:
    """The headers that carry a new `runstate propose` span's context to the worker, and
    that span's context (for `awaiting`); ([], None) when nothing records.

    The span is a child of the caller's current span (the agent's own step, say) and
    ends here: it covers handing the proposal over; `awaiting` covers its outcome."""
    if trace is None:
        return [], None
    tracer = trace.get_tracer(SCOPE)
    span = tracer.start_span(
        "runstate propose",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "messaging.destination.name": topic,
            "runstate.run_id": run_id,
            "runstate.event": event,
            "runstate.proposal_id": proposal_id,
        },
    )
    if not span.is_recording():
        span.end()
        return [], None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    span.end()
    headers: list[tuple[str, str | bytes | None]] = [
        (name, carrier[name].encode()) for name in TRACE_HEADERS if name in carrier
    ]
    return headers, span.get_span_context()


@contextmanager
def awaiting(proposed_context: Any, proposal_id: str) -> Iterator[Any]:
    """A `runstate outcome` span, child of the proposal's `runstate propose` span (or of
    the current span when that is not known), while the caller waits for the outcome;
    yields a function to call with the outcome, which names it on the span."""
    if trace is None:
        yield _ignore
        return
    tracer = trace.get_tracer(SCOPE)
    parent = (
        trace.set_span_in_context(trace.NonRecordingSpan(proposed_context))
        if proposed_context is not None
        else None
    )
    with tracer.start_as_current_span(
        "runstate outcome",
        context=parent,
        kind=SpanKind.CLIENT,
        attributes={"runstate.proposal_id": proposal_id},
    ) as span:
        yield lambda outcome: span.set_attributes(outcome_attributes(outcome))


def _ignore(outcome: object) -> None:
    return None


# -- in a worker --------------------------------------------------------------------------
def configure_worker(
    mode: TraceMode, path: Path | None, service: str, worker_id: str | None
) -> str | None:
    """Set the worker's tracer from its settings; None, or why it cannot (a line to show:
    the `traces` extra missing, an exporter that cannot be opened).

    otlp: spans to an OpenTelemetry collector over OTLP/HTTP, configured by the standard
    `OTEL_EXPORTER_OTLP_*` variables; file: one JSON object per span and line, appended to
    `path` (`-` for stderr)."""
    global _worker_tracer
    if mode == "off":
        _worker_tracer = None
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
            SpanExporter,
        )
    except ImportError:
        return "--traces needs OpenTelemetry's SDK: pip install 'runstate[traces]'"
    attributes: dict[str, str] = {"service.name": os.environ.get("OTEL_SERVICE_NAME", service)}
    if worker_id:
        attributes["service.instance.id"] = worker_id
    provider = TracerProvider(resource=Resource.create(attributes))
    exporter: SpanExporter
    if mode == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            return "--traces otlp needs the OTLP exporter: pip install 'runstate[traces]'"
        exporter = OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    else:
        try:
            out: IO[str] = (
                sys.stderr
                if path is None or str(path) == "-"
                else open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (process-long)
            )
        except OSError as exc:
            return f"--traces-file {path}: {exc.strerror or exc}"
        exporter = ConsoleSpanExporter(
            out=out, formatter=lambda span: span.to_json(indent=None) + "\n"
        )
        # One span written as it ends: a test or a tail of the file sees it at once.
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    # A malformed tracestate is logged per record by OpenTelemetry: a producer of
    # untrusted headers must not write the worker's log.
    logging.getLogger("opentelemetry.trace.span").setLevel(logging.ERROR)
    _worker_tracer = provider.get_tracer(SCOPE)
    return None


def tracing() -> bool:
    """Whether this worker traces (`configure_worker`)."""
    return _worker_tracer is not None


def decided(
    headers: Headers,
    topic: str,
    partition: int,
    offset: int,
    outcome: object,
    began_ns: int,
) -> Any:
    """A `runstate decide` span, from `began_ns` to now, child of the span whose context
    the record's headers carry; its context (for `committed`), or None when this worker
    does not trace or the record carries no valid trace context."""
    tracer = _worker_tracer
    if tracer is None:
        return None
    carrier = _trace_carrier(headers)
    if carrier is None:
        return None
    parent = _PROPAGATOR.extract(carrier)
    if not trace.get_current_span(parent).get_span_context().is_valid:
        return None  # not a trace context: no agent traced this proposal
    attributes: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": topic,
        "messaging.destination.partition.id": str(partition),
        "messaging.kafka.offset": offset,
    }
    attributes.update(outcome_attributes(outcome))
    span = tracer.start_span(
        "runstate decide",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        start_time=began_ns,
    )
    span.end()
    return span.get_span_context()


def committed(decisions: Sequence[Any], began_ns: int, error: str | None = None) -> None:
    """A `runstate commit` span per traced decision of a transaction (or of one delivered
    outcome), child of its `runstate decide`, from `began_ns` to now; `error`: why the
    transaction aborted instead (nothing of it was committed)."""
    tracer = _worker_tracer
    if tracer is None or not decisions:
        return
    ended = time.time_ns()
    batch = len(decisions)
    for decision in decisions:
        span = tracer.start_span(
            "runstate commit",
            context=trace.set_span_in_context(trace.NonRecordingSpan(decision)),
            attributes={"runstate.transaction.proposals": batch},
            start_time=began_ns,
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=ended)


def _trace_carrier(headers: Headers) -> dict[str, str] | None:
    carrier: dict[str, str] = {}
    for name in TRACE_HEADERS:
        raw = header_value(headers, name)
        if raw is None:
            continue
        try:
            text = raw.decode("ascii") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError:
            continue  # W3C: a tracestate that cannot be read is dropped, the parent kept
        if len(text) > MAX_HEADER_CHARS:
            continue
        carrier[name] = text
    return carrier if "traceparent" in carrier else None


# -- both ---------------------------------------------------------------------------------
def outcome_attributes(outcome: object) -> dict[str, Any]:
    """What a span says of an outcome: its kind, and the run, revision, state or
    rejection code it carries (duck-typed: the SDK's and the engine's outcomes both)."""
    kind = type(outcome).__name__
    attributes: dict[str, Any] = {"runstate.outcome": kind}
    transition = getattr(outcome, "transition", outcome)
    for name, attribute in (
        ("run_id", "runstate.run_id"),
        ("proposal_id", "runstate.proposal_id"),
        ("event", "runstate.event"),
        ("revision", "runstate.revision"),
        ("to_state", "runstate.state"),
        ("code", "runstate.rejection.code"),
        ("reason", "runstate.reason"),
    ):
        value = getattr(transition, name, None)
        if isinstance(value, Enum):
            value = value.value
        if isinstance(value, str | int) and not isinstance(value, bool):
            attributes[attribute] = value
    return attributes


__all__ = [
    "TRACE_HEADERS",
    "awaiting",
    "committed",
    "configure_worker",
    "decided",
    "outcome_attributes",
    "proposed",
    "tracing",
]
