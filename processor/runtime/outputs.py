"""How non-transition outputs are written to their topics."""

import base64

from confluent_kafka import Message

from schemas.messages import DeadLetter


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode()


def dead_letter_value(msg: Message, reason: str, at_ms: int) -> str:
    """The DLQ record for `msg`: the reason, where it came from, and its exact bytes."""
    return DeadLetter(
        error=reason,
        topic=msg.topic() or "",
        partition=msg.partition() or 0,
        offset=msg.offset() or 0,
        key_base64=_b64(msg.key()),
        value_base64=_b64(msg.value()),
        at_ms=at_ms,
    ).model_dump_json()
