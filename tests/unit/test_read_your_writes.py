"""Read your writes: a worker applies a committed transition to its state a moment after
the transaction that carried it, so a client shown transition N may ask before the
worker has it. `RunReader` asks for at least the revision it saw (`min_revision`) and the
API waits for it (processor/serving/catch_up.py `caught_up`): over generated histories of
commits, forgotten and re-created runs, and a worker that lags by a random number of
reads, no read is older than what the reader was shown."""

import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from processor.client import RunReader
from processor.runtimes.native.snapshot_cache import SnapshotCache
from processor.serving import catch_up
from processor.serving.node import RunRecord
from processor.serving.read_fence import ReadFence
from schemas.messages import RunSnapshot, Transition
from tests.examples import examples
from tests.unit.driver import Driver
from tests.unit.test_api import FakeNode, M, get, served_over_http

EVENTS = (
    "checkpoint",
    "pause_for_approval",
    "block_on_dependency",
    "dependency_resolved",
    "transient_error",
    "retry",
)


@dataclass
class LaggingNode(FakeNode):
    """A worker whose state moves one committed batch at a time, in commit order, on
    some of the reads (as a worker applies after its transaction commits)."""

    rng: random.Random = field(default_factory=lambda: random.Random(0))
    applied: dict[str, tuple[RunSnapshot | None, list[Transition]]] = field(default_factory=dict)
    unapplied: deque[tuple[str, RunSnapshot | None, list[Transition]]] = field(
        default_factory=deque
    )
    catch_up: float = 0.3  # chance that one more batch is applied before a read
    lock: threading.Lock = field(default_factory=threading.Lock)

    def committed(
        self, run_id: str, snapshot: RunSnapshot | None, history: list[Transition]
    ) -> None:
        with self.lock:
            if run_id not in self.applied and all(r != run_id for r, _, _ in self.unapplied):
                # Behind on a run's updates, not on its existence: a run the worker
                # lacks once the read fence passed is answered 404 at once (run_reads.py).
                self.applied[run_id] = (snapshot, list(history))
                return
            self.unapplied.append((run_id, snapshot, list(history)))

    def run(self, run_id: str, partition: int, *, history: bool) -> RunRecord | None:
        with self.lock:
            if self.unapplied and self.rng.random() < self.catch_up:
                applied_id, snapshot, transitions = self.unapplied.popleft()
                self.applied[applied_id] = (snapshot, transitions)
            snapshot, transitions = self.applied.get(run_id, (None, []))
        return RunRecord(snapshot, transitions if history else ())


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catch_up, "CATCH_UP_POLL_S", 0.0)
    monkeypatch.setattr(catch_up, "CATCH_UP_S", 2.0)


def one_run() -> FakeNode:
    """A worker holding run "r", just created (revision 0)."""
    run = Driver(run_id="r")
    run.create(M)
    return FakeNode(runs={"r": run})


def _play(
    seed: int, url: str, node: LaggingNode, *, tell_reader: bool, recreate: bool = True
) -> int:
    """Commit a generated history over a few runs, reading each run right after each of
    its commits; the number of reads older than the commit just shown."""
    rng = random.Random(seed)
    reader = RunReader([url], timeout=5.0)
    runs: dict[str, Driver] = {}
    stale = 0
    for _ in range(60):
        run_id = rng.choice(("r1", "r2", "r3"))
        run = runs.get(run_id)
        if run is None or (recreate and rng.random() < 0.05):  # new, or forgotten and anew
            later = 0 if run is None else run.now + 60_000 - Driver().now
            if run is not None:  # forgotten, once retention allows, so later
                node.committed(run_id, None, [])
            run = runs[run_id] = Driver(run_id=run_id)
            run.now += later
            decided = run.create(M)
            if rng.random() < 0.8:
                run.commit("start")
        else:
            decided = run.propose(rng.choice(EVENTS), payload={"data": {"n": rng.random()}})
        node.committed(run_id, run.snapshot, run.history)
        shown = run.history[-1]
        if tell_reader:
            reader.saw(shown)
        snapshot = reader.snapshot(run_id)
        history = reader.history(run_id)
        assert decided is not None
        assert run.snapshot is not None
        created = run.snapshot.created_at_ms  # which run of this id: the one just shown
        if (
            snapshot is None
            or (snapshot.created_at_ms, snapshot.revision)
            < (
                created,
                shown.revision,
            )
            or (history[0].at_ms, history[-1].revision) < (created, shown.revision)
        ):
            stale += 1
    return stale


@pytest.mark.parametrize("seed", range(examples(6, least=2)))
def test_a_reader_never_reads_older_than_the_transition_it_was_shown(
    seed: int, quick: None
) -> None:
    node = LaggingNode(rng=random.Random(seed), owned_partitions=[0, 1, 2])
    with served_over_http(node) as url:
        # A run forgotten and created anew is the fence's to get right (below): a worker
        # this far behind could show the older run at a higher revision.
        assert _play(seed, url, node, tell_reader=True, recreate=False) == 0


def test_without_what_it_saw_the_same_reads_are_stale(quick: None) -> None:
    """The control: the lag is real, so the test above can fail."""
    node = LaggingNode(rng=random.Random(1), owned_partitions=[0, 1, 2], catch_up=0.1)
    with served_over_http(node) as url:
        assert _play(1, url, node, tell_reader=False, recreate=False) > 5


def test_what_the_reader_remembers() -> None:
    reader = RunReader(["http://127.0.0.1:9"])
    run = Driver(run_id="a/b")
    run.create(M)
    run.commit("start")
    run.commit("checkpoint", payload={"data": {}})
    _, start, checkpoint = run.history
    assert reader._run_path("a/b", "", None) == "/runs/a%2Fb"
    reader.saw(checkpoint)
    reader.saw(start)  # shown late (a retry's answer): the later one holds
    at = checkpoint.at_ms
    assert (
        reader._run_path("a/b", "/history", None)
        == f"/runs/a%2Fb/history?min_revision=2&at_ms={at}"
    )
    assert reader._run_path("a/b", "", 0) == "/runs/a%2Fb?min_revision=0"  # asked for
    again = Driver(run_id="a/b")  # the run forgotten, and its id created anew later
    again.now = run.now + 60_000
    again.create(M)
    reader.saw(again.history[-1])
    assert reader._seen["a/b"] == (0, again.history[-1].at_ms)
    for outcome in (None, object()):  # rejections, heartbeats: no revision to keep
        reader.saw(outcome)
    reader.SEEN_RUNS = 3
    for i in range(5):
        other = Driver(run_id=f"r{i}")
        other.create(M)
        reader.saw(other.history[-1])
    assert list(reader._seen) == ["r2", "r3", "r4"]  # the latest runs, bounded


@pytest.mark.parametrize("value", ["-1", "x", "1.5", "\u0661", "1e3", " 1"])
def test_a_bad_min_revision_is_refused(value: str) -> None:
    node = FakeNode(runs={"r": Driver(run_id="r")})
    status, body, _ = get(node, f"/runs/r?min_revision={value}")
    assert status == 400 and body["error"].startswith("min_revision must be a whole number")


def test_a_worker_that_does_not_catch_up_says_so_and_one_not_owning_says_that(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(catch_up, "CATCH_UP_S", 0.05)
    node = one_run()
    assert get(node, "/runs/r?min_revision=0")[0] == 200
    for path in ("/runs/r?min_revision=1", "/runs/r/history?min_revision=1"):
        status, body, _ = get(node, path)
        assert status == 503 and (body["revision"], body["min_revision"]) == (0, 1)
        assert "it has not applied it yet; ask again" in body["error"]
    # A run this worker lacks once its commits are in is gone (forgotten) or never was.
    assert get(node, "/runs/unknown?min_revision=3")[0] == 404
    node.owned_partitions = []
    assert get(node, "/runs/r?min_revision=5")[0] == 421


@dataclass
class ApplyingLater(LaggingNode):
    """A worker that applies each commit in its own thread a few ms after it, with the
    commit open in its read fence meanwhile (when `fenced`), as the runtimes do."""

    fenced: bool = True
    delay_s: float = 0.004
    work: "queue.Queue[tuple[int | None, str, RunSnapshot | None, list[Transition]] | None]" = (
        field(default_factory=lambda: queue.Queue())
    )

    def __post_init__(self) -> None:
        threading.Thread(target=self._apply, daemon=True).start()

    def committed(
        self, run_id: str, snapshot: RunSnapshot | None, history: list[Transition]
    ) -> None:
        token = self.read_fence.open() if self.fenced else None
        self.work.put((token, run_id, snapshot, list(history)))

    def _apply(self) -> None:
        while (item := self.work.get()) is not None:
            token, run_id, snapshot, history = item
            time.sleep(self.delay_s * (0.5 + self.rng.random() / 2))
            with self.lock:
                self.applied[run_id] = (snapshot, history)
            if token is not None:
                self.read_fence.close(token)

    def run(self, run_id: str, partition: int, *, history: bool) -> RunRecord | None:
        with self.lock:
            snapshot, transitions = self.applied.get(run_id, (None, []))
        return RunRecord(snapshot, transitions if history else ())


@pytest.mark.parametrize("seed", range(examples(3, least=1)))
def test_a_reader_that_saw_nothing_still_reads_every_commit_before_it(seed: int) -> None:
    """An agent restarted after a crash has seen nothing, yet its read must show the
    transition it wrote just before: the read waits for the commits under way."""
    node = ApplyingLater(rng=random.Random(seed))
    try:
        with served_over_http(node) as url:
            assert _play(seed, url, node, tell_reader=False) == 0
    finally:
        node.work.put(None)


def test_without_the_fence_a_reader_that_saw_nothing_reads_stale() -> None:
    # Applies late enough (10-20 ms) that a read right after a commit comes first.
    node = ApplyingLater(rng=random.Random(1), fenced=False, delay_s=0.02)
    try:
        with served_over_http(node) as url:
            assert _play(1, url, node, tell_reader=False) > 5
    finally:
        node.work.put(None)


def test_a_write_under_way_that_never_ends_is_a_503_not_a_stale_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(catch_up, "CATCH_UP_S", 0.05)
    node = one_run()
    token = node.read_fence.open()
    for path in ("/runs/r", "/runs/r/history", "/runs?state=planned", "/stats", "/inspect?run=r"):
        status, body, _ = get(node, path)
        assert status == 503 and "did not reach this worker's state" in body["error"], path
    node.owned_partitions = []  # a run of another worker's: said at once
    began = time.monotonic()
    assert get(node, "/runs/r?min_revision=0")[0] == 421
    assert time.monotonic() - began < catch_up.CATCH_UP_S
    node.owned_partitions = [0, 1, 2]
    assert get(node, "/livez")[0] == 200 and get(node, "/health")[0] == 200  # not reads of runs
    node.read_fence.close(token)
    assert get(node, "/runs/r")[0] == 200


def test_the_fence_waits_for_the_writes_open_when_asked_not_later_ones() -> None:
    fence = ReadFence()
    first = fence.open()
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(fence.wait(5.0)))
    waiter.start()
    _until(lambda: len(fence._changed._waiters) == 1)  # type: ignore[attr-defined]
    later = fence.open()  # opened after the read came: not waited for
    assert not done
    fence.close(first)
    waiter.join(5.0)
    assert done == [True]
    assert not fence.wait(0.01)  # `later` is still open
    fence.close(later)
    fence.close(later)  # closing twice is harmless
    assert fence.wait(0.0)


def test_reads_waiting_for_a_revision_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A revision asked far ahead holds a server thread for up to CATCH_UP_S: past
    MAX_WAITING_READS such reads, the next is answered at once."""
    monkeypatch.setattr(catch_up, "CATCH_UP_S", 1.0)
    monkeypatch.setattr(catch_up, "_WAITING", threading.BoundedSemaphore(1))
    node = one_run()
    waiting = threading.Thread(target=get, args=(node, "/runs/r?min_revision=9"))
    waiting.start()
    _until(lambda: catch_up._WAITING._value == 0)  # type: ignore[attr-defined]
    began = time.monotonic()
    status, body, _ = get(node, "/runs/r/history?min_revision=9")
    assert status == 503 and "too many reads are waiting already" in body["error"]
    assert time.monotonic() - began < 0.5
    assert get(node, "/runs/r?min_revision=0")[0] == 200  # one already there: no wait
    waiting.join(5.0)
    status, body, _ = get(node, "/runs/r?min_revision=9")  # the slot is free again
    assert status == 503 and "after 1 s" in body["error"]


def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.001)


def test_what_counts_as_applied() -> None:
    run = Driver(run_id="r")
    run.create(M)
    run.commit("start")
    snapshot = run.snapshot
    assert snapshot is not None
    at = snapshot.updated_at_ms
    assert catch_up._applied(snapshot, 1, at) and catch_up._applied(snapshot, 0, None)
    assert not catch_up._applied(snapshot, 2, at)
    # a later transition committed at an earlier broker time (a leader whose clock is
    # behind): the revision decides
    assert catch_up._applied(snapshot, 1, at + 5_000)
    # a run of that id created after the transition asked for: the id used anew
    assert catch_up._applied(snapshot, 9, snapshot.created_at_ms - 1)
    assert not catch_up._applied(snapshot, 9, snapshot.created_at_ms)


def test_a_read_of_the_database_does_not_put_an_older_snapshot_back() -> None:
    """An HTTP thread reads a run from the database just before a commit writes it, and
    puts what it read in the cache just after: the commit's newer snapshot stays."""
    cache = SnapshotCache(10)
    owner = cache.owner()
    old, new = Driver(run_id="r"), Driver(run_id="r")
    old.create(M)
    new.create(M)
    new.commit("start")
    assert old.snapshot is not None and new.snapshot is not None
    began = cache.generation(owner)  # the reader, before its database read
    cache.put(owner, [new.snapshot])  # the commit
    cache.put_read(owner, old.snapshot, began)
    assert cache.get(owner, "r") == new.snapshot
    cache.drop(owner, ["r"])  # forgotten: a read from before does not bring it back
    cache.put_read(owner, old.snapshot, began)
    assert cache.get(owner, "r") is None
    cache.put_read(owner, new.snapshot, cache.generation(owner))  # nothing wrote since
    assert cache.get(owner, "r") == new.snapshot
