"""What the HTTP API sends back: an `Answer`, its JSON or HTML shaped once."""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

JSON = "application/json"
HTML = "text/html; charset=utf-8"


@dataclass(frozen=True)
class Answer:
    """What the server sends back: status, Content-Type, body and any other headers (a
    name may come more than once: a 401's challenges)."""

    status: int
    content_type: str
    body: bytes
    headers: Sequence[tuple[str, str]] = ()


def json_answer(status: int, body: Any) -> Answer:
    return Answer(status, JSON, json.dumps(body).encode())


def html_answer(status: int, text: str) -> Answer:
    return Answer(status, HTML, text.encode())
