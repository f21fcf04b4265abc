"""A librdkafka call that blocks past its timeout is reported, not waited on forever."""

import threading
import time

import pytest

from processor.runtime import worker
from processor.runtime.worker import ClientHung, bounded


def test_a_call_that_returns_passes_its_result_or_error(monkeypatch: pytest.MonkeyPatch) -> None:
    bounded("quick", lambda: None, 1)
    with pytest.raises(ValueError, match="boom"):
        bounded("failing", lambda: (_ for _ in ()).throw(ValueError("boom")), 1)


def test_a_call_that_never_returns_is_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "HUNG_AFTER_S", 0.2)
    never = threading.Event()
    started = time.monotonic()
    with pytest.raises(ClientHung, match="send_offsets_to_transaction"):
        bounded("send_offsets_to_transaction", never.wait, 0.1)
    assert time.monotonic() - started < 2
    never.set()
