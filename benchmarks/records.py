"""A record for the proposals topic as the load generators send it: shared by the
benchmarks and the fault harness (which adds hostile kinds with their expected outcome)."""

from dataclasses import dataclass

Headers = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True)
class RawRecord:
    key: bytes | None
    value: bytes | None
    headers: Headers
    kind: str = "good"
    expect: str | None = None  # DLQ or a rejection code; None for the good workload
