"""How non-transition outputs are written to their topics (shared by both runtimes)."""

import base64

from schemas.messages import DeadLetter


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode()


def dead_letter_value(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    reason: str,
    at_ms: int,
) -> bytes:
    """The DLQ record for a record: the reason, where it came from, and its exact bytes."""
    return (
        DeadLetter(
            error=reason,
            topic=topic,
            partition=partition,
            offset=offset,
            key_base64=_b64(key),
            value_base64=_b64(value),
            at_ms=at_ms,
        )
        .model_dump_json()
        .encode()
    )
