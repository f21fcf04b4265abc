"""A librdkafka call that blocks past its timeout is reported, not waited on forever."""

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.runtime import worker
from processor.runtime.worker import ClientBroken, ClientHung, abort_transaction, bounded


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


class _Producer:
    """abort_transaction answers with these errors, in turn, then succeeds."""

    def __init__(self, *errors: KafkaError) -> None:
        self.errors, self.calls = list(errors), 0

    def abort_transaction(self, timeout: float) -> None:
        self.calls += 1
        if self.errors:
            raise KafkaException(self.errors.pop(0))


TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "retry call to resume", retriable=True)


def test_an_abort_that_timed_out_is_called_again_until_done() -> None:
    producer = _Producer(TIMED_OUT, TIMED_OUT)
    abort_transaction(producer, attempts=3, timeout_s=1)  # type: ignore[arg-type]
    assert producer.calls == 3


def test_an_abort_that_never_finishes_restarts_the_worker() -> None:
    producer = _Producer(TIMED_OUT, TIMED_OUT, TIMED_OUT)
    with pytest.raises(ClientBroken, match="not aborted"):
        abort_transaction(producer, attempts=3, timeout_s=1)  # type: ignore[arg-type]


def test_a_fatal_abort_restarts_the_worker_and_nothing_to_abort_is_fine() -> None:
    fatal = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    with pytest.raises(ClientBroken, match="cannot abort"):
        abort_transaction(_Producer(fatal), timeout_s=1)  # type: ignore[arg-type]
    nothing = KafkaError(KafkaError._STATE, "no transaction")
    abort_transaction(_Producer(nothing), timeout_s=1)  # type: ignore[arg-type]
