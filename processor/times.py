"""Times as runstate handles them: milliseconds since the epoch, read from what people
type and shown as spans people read."""

import time
from datetime import datetime


def now_ms() -> int:
    """The wall clock in milliseconds since the epoch (what record timestamps hold)."""
    return int(time.time() * 1000)


def parse_time(text: str) -> int:
    """Milliseconds since the epoch, from digits (ms) or an ISO-8601 time with a zone;
    ValueError naming what is wrong otherwise."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(
            f"'{text}' is neither epoch milliseconds nor ISO-8601 (2026-11-29T10:00:00Z)"
        ) from exc
    if moment.tzinfo is None:
        raise ValueError(f"'{text}' has no time zone; add Z or +01:00")
    return int(moment.timestamp() * 1000)


def duration(ms: int, separator: str = "") -> str:
    """A span as minutes and seconds, with hours when there are any ("1h02m03s",
    "2m03s"; with `separator` " ": "1h 02m 03s"); a negative span (clocks apart) as 0."""
    seconds = max(0, ms) // 1000
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{separator}{minutes:02d}m{separator}{seconds:02d}s"
    return f"{minutes}m{separator}{seconds:02d}s"
