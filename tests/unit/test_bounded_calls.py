"""A librdkafka call that blocks past its timeout is reported, not waited on forever,
and the worker restarts in place (or stops, if asked) without hanging on its clients."""

import gc
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from processor.cli import worker as worker_cli
from processor.config import KafkaSettings, WorkerConfig
from processor.errors import ClientBroken, ClientHung
from processor.keyring import generate_keyring
from processor.machines import builtin_machines
from processor.runtime import producer
from processor.runtime.producer import abort_transaction, bounded
from processor.runtime.worker import Worker
from processor.topics import TopicNames


def test_a_call_that_returns_passes_its_result_or_error(monkeypatch: pytest.MonkeyPatch) -> None:
    bounded("quick", lambda: None, 1)
    with pytest.raises(ValueError, match="boom"):
        bounded("failing", lambda: (_ for _ in ()).throw(ValueError("boom")), 1)


def test_a_call_that_never_returns_is_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producer, "HUNG_AFTER_S", 0.2)
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


class _Client:
    """A client whose close would block (a hung librdkafka call), its destructor too."""

    def __init__(self, name: str) -> None:
        self.name = name

    def close(self) -> None:
        raise AssertionError(f"{self.name} closed: that blocks while a call of it hangs")


def test_a_broken_worker_neither_closes_nor_frees_its_clients(tmp_path: Path) -> None:
    """Regression (fault harness, broker restart): dropping the clients ran their
    destructors, which blocked forever behind a hung send_offsets_to_transaction; the
    worker never reached its restart in place and kept its partitions. A broken worker
    keeps them (the CLI holds the worker until it replaces the process image)."""
    config = WorkerConfig(
        kafka=KafkaSettings("127.0.0.1:1"),
        topics=TopicNames.with_prefix("t."),
        keyring=generate_keyring(),
        machines=builtin_machines(),
        state_dir=tmp_path,
    )
    broken = Worker(config)
    clients = _Client("consumer"), _Client("producer")
    alive = [weakref.ref(c) for c in clients]
    broken.consumer, broken.producer = clients  # type: ignore[assignment]

    def hang(interval: float) -> None:
        raise ClientHung("send_offsets_to_transaction has not returned after 15s")

    def no_producer() -> None:  # the broker is still away: the replacement fails too
        raise ClientBroken("the producer could not start its transactions: timed out")

    broken._step = hang  # type: ignore[method-assign]
    broken._new_producer = no_producer  # type: ignore[assignment,method-assign]
    with pytest.raises(ClientBroken, match="could not start"):
        broken.run()
    del clients
    gc.collect()
    assert [ref() is not None for ref in alive] == [True, True]
    assert broken.consumer is alive[0]()
    assert broken.producer is alive[1]() or alive[1]() in broken._retired


@pytest.fixture
def signal_mask() -> Iterator[None]:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, before)


def test_a_restart_in_place_keeps_stop_signals_pending_across_exec(
    monkeypatch: pytest.MonkeyPatch, signal_mask: None
) -> None:
    """Regression (fault harness): a SIGTERM that came while the new image started,
    before its handler existed, killed it (-15) instead of stopping it."""
    seen: list[set[signal.Signals]] = []
    monkeypatch.setattr(
        os, "execv", lambda *_: seen.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    )
    worker_cli.restart_in_place(lambda: False, "the producer failed")
    assert len(seen) == 1 and seen[0] >= worker_cli.STOP_SIGNALS


def test_a_worker_asked_to_stop_stops_instead_of_restarting(
    monkeypatch: pytest.MonkeyPatch, signal_mask: None
) -> None:
    monkeypatch.setattr(os, "execv", lambda *_: pytest.fail("restarted"))
    worker_cli.restart_in_place(lambda: True, "the producer failed")
    assert not worker_cli.STOP_SIGNALS & signal.pthread_sigmask(signal.SIG_BLOCK, [])
