"""The spans a test records: the agent's, in memory, through OpenTelemetry's global tracer
provider (as an application sets it); the worker's, from the JSON lines of `--traces file`."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def _reset_global_provider() -> None:
    # OpenTelemetry sets its global provider once per process; its own test utilities
    # reset it the same way between tests.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@contextmanager
def agent_spans() -> Iterator[InMemorySpanExporter]:
    """The spans ended inside the block, with a tracer provider set as an agent sets it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_global_provider()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset_global_provider()


def file_spans(path: Path) -> list[dict[str, Any]]:
    """The spans a worker wrote with `--traces file`, one JSON object per line."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def hex_id(value: int, digits: int) -> str:
    """A span's or trace's id as the JSON export writes it ('0x' and lowercase hex)."""
    return f"0x{value:0{digits}x}"
