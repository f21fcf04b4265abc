"""What the worker's loop calls per proposal keeps the GIL.

A call that lets the GIL go must win it back, and while another Python thread holds it
(a commit's delivery reports, an HTTP reader) that takes up to the switch interval,
5 ms: hmac.digest and a RocksDB multi-get each cost the loop milliseconds that way, for
microseconds of work. Measured against a thread that always wants the GIL: a call that
keeps it costs microseconds; one that lets it go costs milliseconds."""

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from processor.runtimes.native.store.partition import PartitionStore
from processor.trust.signatures import hmac_signature

CALLS = 2_000
#: A call that keeps the GIL takes a few microseconds (4 ms in all, with room here for a
#: machine 100x slower); one that lets it go took 0.8-5 ms each (1.6-10 s in all).
BOUND_S = 0.5


@pytest.fixture
def busy_thread() -> Iterator[None]:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(50))

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    time.sleep(0.02)
    yield
    stop.set()
    thread.join()


def _seconds(call: Callable[[], object]) -> float:
    began = time.perf_counter()
    for _ in range(CALLS):
        call()
    return time.perf_counter() - began


@pytest.mark.usefixtures("busy_thread")
def test_verifying_an_hmac_keeps_the_gil() -> None:
    base = b"runstate-proposal-v1\n" + b"x" * 200
    assert _seconds(lambda: hmac_signature("a secret", base)) < BOUND_S


@pytest.mark.usefixtures("busy_thread")
def test_the_stores_lookups_on_the_loop_keep_the_gil(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "p0")
    keys = [f"key-{n}".encode() for n in range(20)]
    try:
        assert _seconds(lambda: store._get_each(keys)) < BOUND_S
        assert _seconds(lambda: store.committed_snapshot("no-such-run")) < BOUND_S
    finally:
        store.close()
