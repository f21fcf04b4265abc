"""A librdkafka call that blocks past its timeout is reported, not waited on forever,
and the worker replaces its producer (or restarts in place, or stops, if asked) without
hanging on its clients; a replaced producer is freed once its hung call returns."""

import gc
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.cli import worker as worker_cli
from processor.kafka.config import KafkaSettings
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines
from processor.runtimes.errors import ClientBroken, ClientHung
from processor.runtimes.native import producer
from processor.runtimes.native.producer import abort_transaction, bounded
from processor.runtimes.native.worker import Worker
from processor.runtimes.settings import WorkerConfig, WorkerSettings
from processor.trust.keygen import generate_keyring


def _offline_config(state_dir: Path) -> WorkerConfig:
    """A worker's configuration pointing at no broker (its clients are replaced)."""
    return WorkerConfig(
        kafka=KafkaSettings("127.0.0.1:1"),
        topics=TopicNames.with_prefix("t."),
        keyring=generate_keyring(),
        machines=builtin_machines(),
        settings=WorkerSettings(state_dir=state_dir),
    )


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
    """Dropping the clients would run their destructors, which block forever behind a
    hung send_offsets_to_transaction (a broker restarting): the worker would never
    reach its restart in place and keep its partitions. A broken worker keeps its
    clients (the CLI holds the worker until it replaces the process image)."""
    broken = Worker(_offline_config(tmp_path))
    clients = _Client("consumer"), _Client("producer")
    alive = [weakref.ref(c) for c in clients]
    broken.consumer, broken.commits.producer = clients  # type: ignore[assignment]

    def hang(interval: float) -> None:
        never = threading.Event()  # the hung call never returns
        raise ClientHung("send_offsets_to_transaction has not returned after 15s", never)

    def no_producer() -> None:  # the broker is still away: the replacement fails too
        raise ClientBroken("the producer could not start its transactions: timed out")

    broken._step = hang  # type: ignore[method-assign]
    broken.commits.new_producer = no_producer  # type: ignore[assignment,method-assign]
    with pytest.raises(ClientBroken, match="could not start"):
        broken.run()
    del clients
    gc.collect()
    assert [ref() is not None for ref in alive] == [True, True]
    assert broken.consumer is alive[0]()
    assert broken.commits.producer is alive[1]()


@pytest.fixture
def signal_mask() -> Iterator[None]:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, before)


def test_a_restart_in_place_keeps_stop_signals_pending_across_exec(
    monkeypatch: pytest.MonkeyPatch, signal_mask: None
) -> None:
    """A SIGTERM that comes while the new image starts, before its handler exists, stops
    it rather than kills it (-15): the signals stay blocked across the exec."""
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


class _Consumer:
    def __init__(self) -> None:
        self.paused: list[int] = []

    def pause(self, partitions: list[object]) -> None:
        self.paused += [tp.partition for tp in partitions]  # type: ignore[attr-defined]


class _NewProducer:
    """What `_new_producer` hands back: an idle producer that records its close."""

    def __init__(self) -> None:
        self.open = False
        self.committing = False
        self.closed = threading.Event()
        self.retired_after: list[threading.Event | None] = []

    def close(self) -> None:
        self.closed.set()

    def retire(self, hung: threading.Event | None) -> threading.Thread:
        self.retired_after.append(hung)
        return threading.Thread(target=self.close)


class _RestoreJob:
    made: ClassVar[list[dict[int, object]]] = []

    def __init__(self, settings: object, topics: object, stores: dict[int, object]) -> None:
        self.stores = stores
        _RestoreJob.made.append(stores)


def _worker_owning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Worker:
    from processor.runtimes.native import assignment
    from processor.runtimes.native.store.partition import PartitionStore

    monkeypatch.setattr(assignment, "RestoreJob", _RestoreJob)
    _RestoreJob.made = []
    worker = Worker(_offline_config(tmp_path))
    worker.consumer = worker.commits.consumer = _Consumer()  # type: ignore[assignment]
    worker.commits.producer = _NewProducer()  # type: ignore[assignment]
    worker.commits.new_producer = _NewProducer  # type: ignore[assignment,method-assign]
    worker.stores.add({p: PartitionStore(tmp_path / f"p{p}") for p in (0, 2)})
    worker.commits.transaction = worker.commits.new_transaction()
    return worker


def test_a_hung_producer_is_replaced_and_the_stores_catch_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody knows whether the hung transaction committed: both transactions go unapplied,
    the old producer stays referenced (its destructor would block), and every owned
    store catches up from the changelog with its partition paused meanwhile."""
    worker = _worker_owning(tmp_path, monkeypatch)
    commits = worker.commits
    old, transaction = commits.producer, commits.transaction
    commits.committing = transaction
    commits._fenced = worker.read_fence.open()  # its commit, which reads wait for
    commits.stale_coordinator = True
    returned = threading.Event()
    worker._replace_producer(
        ClientHung("send_offsets_to_transaction has not returned after 3s", returned)
    )
    assert worker.read_fence.wait(0.0), "reads would wait for a commit nobody finishes"
    assert commits.producer is not old
    assert old.retired_after == [returned]  # type: ignore[union-attr]
    assert commits.committing is None and commits.transaction is not transaction
    assert commits.transaction is not None and not commits.transaction.open
    assert commits.transaction.producer is commits.producer
    assert sorted(_RestoreJob.made[0]) == [0, 2] and worker.stores.owned() == []
    assert sorted(worker.consumer.paused) == [0, 2]  # type: ignore[union-attr]
    assert not commits.stale_coordinator and worker.stats.aborts == 1
    for store in _RestoreJob.made[0].values():
        store.close()  # type: ignore[attr-defined]


def test_a_fresh_producer_waits_for_a_moment_between_transactions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the group lost its coordinator the producer is swapped, but never under an
    open transaction; the old one is closed (it holds none) off the loop's thread."""
    worker = _worker_owning(tmp_path, monkeypatch)
    commits = worker.commits
    old = commits.producer
    assert commits.transaction is not None
    commits.transaction._produced = True  # a transaction is open
    commits.stale_coordinator = True
    commits.fresh_producer()
    assert commits.producer is old and commits.stale_coordinator
    commits.transaction = commits.new_transaction()
    commits.fresh_producer()
    assert commits.producer is not old and not commits.stale_coordinator
    assert commits.transaction.producer is commits.producer
    assert old.closed.wait(5)  # type: ignore[union-attr]
    worker.stores.close()


class _RetiredClient:
    """A librdkafka producer given up on: records what is called on it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def purge(self, blocking: bool = True) -> None:
        self.calls.append("purge")

    def poll(self, timeout: float) -> None:
        if self.calls[-1] != "poll":
            self.calls.append("poll")

    def close(self) -> None:
        self.calls.append("close")


def test_a_retired_producer_is_closed_and_freed_only_once_its_hung_call_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kept until the process ended, every replaced producer held its handle and buffers
    (a worker's RSS rose 5-10 MB with each broker restart that hung a call); closed
    while its call still ran, `rd_kafka_destroy` would block or free what the call uses."""
    monkeypatch.setattr(producer, "HUNG_AFTER_S", 0.1)
    release = threading.Event()
    with pytest.raises(ClientHung) as hung:
        bounded("send_offsets_to_transaction", release.wait, 0.05)
    client = _RetiredClient()
    retired = object.__new__(producer.TransactionalProducer)
    retired.client = client  # type: ignore[assignment]
    alive = weakref.ref(retired)
    closing = retired.retire(hung.value.returned)
    del retired
    time.sleep(0.3)
    assert "close" not in client.calls and closing.is_alive()
    gc.collect()
    assert alive() is not None  # the hung call may still use it
    release.set()
    closing.join(5)
    assert client.calls == ["purge", "poll", "close"]
    del closing
    gc.collect()
    assert alive() is None


def test_a_producer_given_up_on_without_a_call_running_is_closed_at_once() -> None:
    client = _RetiredClient()
    retired = object.__new__(producer.TransactionalProducer)
    retired.client = client  # type: ignore[assignment]
    retired.retire(None).join(5)
    assert client.calls == ["purge", "poll", "close"]


class _Rewinding(_Consumer):
    """committed() fails with these errors, in turn, then answers offset 40 for each."""

    def __init__(self, *errors: KafkaError) -> None:
        super().__init__()
        self.errors, self.asked = list(errors), 0
        self.sought: dict[int, int] = {}
        self.resumed: list[int] = []

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.asked += 1
        if self.errors:
            raise KafkaException(self.errors.pop(0))
        return [TopicPartition(tp.topic, tp.partition, 40) for tp in partitions]

    def seek(self, tp: TopicPartition) -> None:
        self.sought[tp.partition] = tp.offset

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.resumed += [tp.partition for tp in partitions]


def test_a_rewind_waits_out_a_moving_group_coordinator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the committed offsets after an abort fails NOT_COORDINATOR while the group
    coordinator moves (a broker killed): the rewind asks again until it answers, rather
    than taking the worker down."""
    from processor.runtimes.native import commits

    monkeypatch.setattr(commits.time, "sleep", lambda _: None)
    worker = _worker_owning(tmp_path, monkeypatch)
    moving = KafkaError(KafkaError.NOT_COORDINATOR, "Not coordinator")
    consumer = _Rewinding(moving, moving)
    commits.rewind(consumer, worker.topics.proposals, [0, 2])  # type: ignore[arg-type]
    assert consumer.asked == 3 and consumer.sought == {0: 40, 2: 40}
    worker.stores.close()


def test_a_rewind_that_cannot_be_made_is_a_broken_client_and_no_partition_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Going on from where the consumer stands would skip what the abort undid: when the
    offsets cannot be read, ClientBroken (the loop replaces the producer and catches
    up). The restore that was finishing is no longer listed, so when the partitions
    then go, their stores close once (closed twice, `DB instance already closed` would
    take the worker down)."""
    from processor.runtimes.native import commits

    monkeypatch.setattr(commits, "REWIND_PATIENCE_S", 0.0)
    worker = _worker_owning(tmp_path, monkeypatch)
    moving = KafkaError(KafkaError.NOT_COORDINATOR, "Not coordinator")
    consumer = _Rewinding(*[moving] * 5)
    owned = {p: worker.stores.take([p])[p] for p in (0, 2)}

    class _Done:
        done, error, applied, stores = True, None, 0, owned

    assignment = worker.assignment
    assignment.restores.append(_Done())  # type: ignore[arg-type]
    with pytest.raises(ClientBroken, match="committed offsets"):
        assignment.finish_restores(consumer)  # type: ignore[arg-type]
    assert assignment.restores == [] and worker.stores.owned() == [0, 2]
    assert consumer.resumed == [] and consumer.sought == {}
    with assignment.letting_go([TopicPartition("t.proposals", p) for p in (0, 2)]):
        pass
    assert worker.stores.owned() == []
    for store in owned.values():
        store.close()  # closing again does nothing


class _FetchStarting(_Rewinding):
    """The consumer of a fresh assignment: a partition's seek is refused (_STATE) until its
    fetch has started, after `refusals[p]` seeks (None: never, a start dropped for good)."""

    def __init__(self, refusals: dict[int, int | None]) -> None:
        super().__init__()
        self.refusals = refusals
        self.calls: list[tuple[str, list[int]]] = []

    def seek(self, tp: TopicPartition) -> None:
        left = self.refusals.get(tp.partition, 0)
        if left is None or left > 0:
            if left is not None:
                self.refusals[tp.partition] = left - 1
            raise KafkaException(KafkaError(KafkaError._STATE, "Local: Erroneous state"))
        super().seek(tp)

    def resume(self, partitions: list[TopicPartition]) -> None:
        super().resume(partitions)
        self.calls.append(("resume", [tp.partition for tp in partitions]))

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("unassign", [tp.partition for tp in partitions]))

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.calls.append(("assign", [tp.partition for tp in partitions]))
        for tp in partitions:  # a fresh start of its fetch
            self.refusals[tp.partition] = 0

    def pause(self, partitions: list[object]) -> None:
        super().pause(partitions)
        self.calls.append(("pause", [tp.partition for tp in partitions]))  # type: ignore[attr-defined]


def _restored(worker: Worker, partitions: tuple[int, ...]) -> dict[int, object]:
    """The worker's stores of `partitions` handed to a restore that is done."""
    owned = worker.stores.take(list(partitions))

    class _Done:
        done, error, applied, stores = True, None, 0, owned

    worker.assignment.restores.append(_Done())  # type: ignore[arg-type]
    return owned  # type: ignore[return-value]


def test_a_restored_partition_resumes_only_once_the_consumer_fetches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """librdkafka drops a partition's fetch start that a resume overtakes, and the
    partition is then never fetched: a restored partition stays paused, its store owned
    but not ready, until its seek to the committed offset is taken; then it resumes from
    there. The others do not wait for it."""
    from processor.runtimes.native import assignment as module

    monkeypatch.setattr(module, "FETCH_START_RETRY_S", 0.0)
    worker = _worker_owning(tmp_path, monkeypatch)
    _restored(worker, (0, 2))
    consumer = _FetchStarting({0: 2})
    assignment = worker.assignment
    assignment.finish_restores(consumer)  # type: ignore[arg-type]
    assert consumer.calls == [("resume", [2])] and consumer.sought == {2: 40}
    assert worker.stores.owned() == [0, 2] and worker.restoring == [0]  # (/readyz)
    assignment.finish_restores(consumer)  # type: ignore[arg-type]
    assert consumer.calls == [("resume", [2])]
    assignment.finish_restores(consumer)  # type: ignore[arg-type]
    assert consumer.calls == [("resume", [2]), ("resume", [0])]
    assert consumer.sought == {0: 40, 2: 40} and assignment.restoring == []
    worker.stores.close()


def test_a_partition_whose_fetch_never_starts_is_assigned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch start dropped for good leaves the seek refused forever: after
    FETCH_START_PATIENCE_S the partition is unassigned and assigned again, paused, and
    resumed once that fetch has started. Going before then drops the wait."""
    from processor.runtimes.native import assignment as module

    monkeypatch.setattr(module, "FETCH_START_RETRY_S", 0.0)
    worker = _worker_owning(tmp_path, monkeypatch)
    _restored(worker, (0, 2))
    consumer = _FetchStarting({0: None})
    assignment = worker.assignment
    assignment.finish_restores(consumer)  # type: ignore[arg-type]
    assignment.finish_restores(consumer)  # type: ignore[arg-type]
    assert consumer.calls == [("resume", [2])]
    monkeypatch.setattr(module, "FETCH_START_PATIENCE_S", 0.0)
    assignment.finish_restores(consumer)  # type: ignore[arg-type]
    assert consumer.calls[1:] == [("unassign", [0]), ("assign", [0]), ("pause", [0])]
    assert assignment.restoring == [0]
    assignment.finish_restores(consumer)  # type: ignore[arg-type]
    assert consumer.calls[-1] == ("resume", [0]) and assignment.restoring == []
    worker.stores.close()

    worker = _worker_owning(tmp_path / "again", monkeypatch)
    _restored(worker, (0,))
    worker.assignment.finish_restores(_FetchStarting({0: None}))  # type: ignore[arg-type]
    assert worker.assignment.restoring == [0]
    with worker.assignment.letting_go([TopicPartition("t.proposals", 0)]):
        pass
    assert worker.assignment.restoring == [] and worker.assignment.starting == {}
    worker.stores.close()
