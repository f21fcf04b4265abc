"""The partition store under hostile conditions: its layout's version checked at open,
records it cannot read skipped on restore, and its cache shared with HTTP threads."""

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.records.changelog_keys import (
    FIRED_CHANGELOG_PREFIX,
    HISTORY_CHANGELOG_PREFIX,
    history_changelog_key,
)
from processor.runtimes.native.snapshot_cache import SnapshotCache
from processor.runtimes.native.store import keys
from processor.runtimes.native.store.keys import StoreFormatError
from processor.runtimes.native.store.partition import PartitionStore
from tests.examples import examples
from tests.unit.driver import Driver


def _committed(store: PartitionStore, run_id: str, machine: str = "run_state") -> None:
    run = Driver(run_id=run_id)
    txn = store.begin()
    txn.stage(run.create(machine))
    txn.flush({"changelog": 1})


def test_a_newer_layout_is_refused_and_an_older_one_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PartitionStore(tmp_path / "p0")
    _committed(store, "r1")
    store.close()

    monkeypatch.setattr(keys, "STORE_FORMAT", keys.STORE_FORMAT - 1)
    with pytest.raises(StoreFormatError, match="newer than this worker"):
        PartitionStore(tmp_path / "p0")

    monkeypatch.setattr(keys, "STORE_FORMAT", keys.STORE_FORMAT + 2)
    rebuilt = PartitionStore(tmp_path / "p0")  # an older layout: emptied, restore refills
    assert rebuilt.committed_snapshot("r1") is None and rebuilt.offset("changelog") is None
    rebuilt.close()
    again = PartitionStore(tmp_path / "p0")  # and marked with the new layout
    assert again.offset("changelog") is None
    again.close()


def test_restore_skips_what_it_cannot_read(tmp_path: Path) -> None:
    good = Driver(run_id="good").create("task_lifecycle")
    # A run id that spells the fired-mark prefix (older versions let one commit), a key
    # that is not UTF-8, a value that is not a snapshot, a history record without a
    # revision, one under a key that is not a history key, one whose key names another
    # revision than its transition.
    spelled = Driver(run_id="x").create("run_state").snapshot.model_dump_json().encode()
    transition = good.transition.model_dump_json().encode()
    store = PartitionStore(tmp_path / "p0")
    store.restore(
        [
            (FIRED_CHANGELOG_PREFIX + b"evil", spelled),
            (b"\xff\xfe", good.snapshot.model_dump_json().encode()),
            (b"junk", b"not json"),
            (b"good", good.snapshot.model_dump_json().encode()),
            (history_changelog_key("good", 0), transition),
            (history_changelog_key("good", 1), b"{}"),
            (HISTORY_CHANGELOG_PREFIX + b"good", transition),
            (history_changelog_key("good", 5), transition),
        ],
        {"changelog": 8},
    )
    assert store.committed_snapshot("good") == good.snapshot
    assert [t.revision for t in store.history("good")] == [0]
    assert store.unreadable == 6
    assert store.offset("changelog") == 8  # and restore does not stop there
    store.close()


def test_the_cache_is_safe_under_concurrent_readers(tmp_path: Path) -> None:
    # HTTP threads read snapshots while the worker commits: with a small cache every
    # commit evicts, the case that turned a valid proposal into an "internal error".
    store = PartitionStore(tmp_path / "p0", SnapshotCache(3))
    ids = [f"r{i}" for i in range(12)]
    for run_id in ids:
        _committed(store, run_id)
    failures: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                for run_id in ids[:3]:  # mostly cached: found, then moved to the end
                    assert store.committed_snapshot(run_id) is not None
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads between any two bytecodes, nearly
    for thread in threads:
        thread.start()
    try:
        for _ in range(300):
            for run_id in ids:  # every one a miss that evicts another
                store.committed_snapshot(run_id)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sys.setswitchinterval(interval)
    store.close()
    assert failures == []


def test_restore_indexes_timers_behind_a_step_result_that_spells_the_field(
    tmp_path: Path,
) -> None:
    run = Driver(run_id="r1", tick_ms=10)
    run.create("task_lifecycle", deadlines={"heartbeat_timeout_ms": 60_000})
    run.commit("start")
    run.commit("step_started", payload={"step": "s", "idempotency_key": "k"})
    done = run.commit("step_succeeded", payload={"step": "s", "result": {"timers": []}})
    assert done.snapshot.timers  # the heartbeat deadline, armed
    value = done.snapshot.model_dump_json().encode()
    assert b'"timers":[]' in value  # the step result spells an empty timer list
    store = PartitionStore(tmp_path / "p0")
    store.restore([(b"r1", value)], {"changelog": 1})
    assert store.due_runs(done.snapshot.timers[0].due_at_ms) == ["r1"]
    store.close()


_RESTORE_THEN_DIE = """
import os, sys
from pathlib import Path
from processor.records.outputs import snapshot_index
from processor.runtimes.native.store.partition import PartitionStore
from tests.unit.driver import Driver

store = PartitionStore(Path(sys.argv[1]))
snapshot = Driver(run_id="r1").create("run_state").snapshot
store.restore([(b"r1", snapshot.model_dump_json().encode(), snapshot_index(snapshot))], {"c": 5})
if sys.argv[2] == "flush":
    store.flush_restored()
os._exit(0)  # as a SIGKILL: no close
"""


@pytest.mark.parametrize("flushed", [True, False])
def test_a_restore_is_all_there_once_flushed_and_at_worst_absent_before(
    tmp_path: Path, flushed: bool
) -> None:
    """Restore skips the write-ahead log: a process that dies before `flush_restored` loses what
    restore wrote, offsets included (so the next restore reads it again), never half."""
    path = tmp_path / "p0"
    argv = [sys.executable, "-c", _RESTORE_THEN_DIE, str(path), "flush" if flushed else "-"]
    subprocess.run(argv, check=True, cwd=Path(__file__).resolve().parents[2], timeout=120)
    store = PartitionStore(path)
    found = (store.offset("c"), store.committed_snapshot("r1") is not None)
    store.close()
    assert found == ((5, True) if flushed else (None, False))


def test_stores_report_rocksdbs_memory_by_kind(tmp_path: Path) -> None:
    """The gauge runstate_store_memory_bytes: memtables summed over the stores, the
    block cache (one, shared) counted once."""
    from processor.runtimes.native.stores import StoreRegistry

    stores = StoreRegistry()
    empty = stores.memory()
    assert empty == {"memtables": 0, "table_readers": 0, "block_cache": 0}
    owned = {p: PartitionStore(tmp_path / f"p{p}") for p in (0, 1)}
    for p, store in owned.items():
        for i in range(50):
            _committed(store, f"run-{p}-{i}")
    stores.add(owned)
    each = [store.memory() for store in owned.values()]
    total = stores.memory()
    assert total["memtables"] == sum(m["memtables"] for m in each) > 0
    assert total["block_cache"] == max(m["block_cache"] for m in each)
    stores.drop(list(owned))


_COMMIT_THEN_DIE = """
import os, sys
from pathlib import Path
from processor.runtimes.native.store import options
from processor.runtimes.native.store.partition import PartitionStore
from tests.unit.driver import Driver

options._WRITE_BUFFER_BYTES = 64 << 10  # memtables reach disk every few batches
store = PartitionStore(Path(sys.argv[1]))
for batch in range(1, int(sys.argv[2]) + 1):
    txn = store.begin()
    for n in range(20):
        txn.stage(Driver(run_id=f"r{batch}-{n}").create("task_lifecycle"))
    txn.flush({"c": batch})  # the changelog offset this batch reaches
if sys.argv[3] == "close":
    store.close()
os._exit(0)  # as a SIGKILL when not closed
"""


@pytest.mark.parametrize("batches", [1, 40, 200])
@pytest.mark.parametrize("ending", ["crash", "close"])
def test_live_commits_survive_a_crash_as_a_prefix_with_their_offset(
    tmp_path: Path, batches: int, ending: str
) -> None:
    """A crash keeps the batches up to some point, each with the offset it reached, and
    nothing after it (the next restore reads the rest from the changelog); a clean close
    keeps all of them."""
    path = tmp_path / "p0"
    argv = [sys.executable, "-c", _COMMIT_THEN_DIE, str(path), str(batches), ending]
    subprocess.run(argv, check=True, cwd=Path(__file__).resolve().parents[2], timeout=120)
    store = PartitionStore(path)
    reached = store.offset("c") or 0
    present = {
        b: [store.committed_snapshot(f"r{b}-{n}") is not None for n in range(20)]
        for b in range(1, batches + 1)
    }
    store.close()
    assert all(all(runs) for b, runs in present.items() if b <= reached)
    assert not any(any(runs) for b, runs in present.items() if b > reached)
    if ending == "close":
        assert reached == batches
    elif batches == 200:  # many write buffers' worth: most of it reached the disk
        assert reached > 100


def test_the_worker_collects_cycles_rarely_and_never_visits_what_start_up_made() -> None:
    code = (
        "import gc\n"
        "from processor.runtimes.native.heap import GC_THRESHOLDS, tune_collector\n"
        "tune_collector()\n"
        "assert gc.get_threshold() == GC_THRESHOLDS, gc.get_threshold()\n"
        # What start-up made is frozen: the collector's generations hold next to nothing.
        "assert gc.get_freeze_count() > 1_000, gc.get_freeze_count()\n"
        "assert len(gc.get_objects()) < 100, len(gc.get_objects())\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_one_cache_bounds_every_store_of_the_process(tmp_path: Path) -> None:
    """The decoded snapshots kept are bounded for the process, however many partitions
    it owns; each store sees its own runs only, and lets go of them when it closes."""
    cache = SnapshotCache(5)
    stores = [PartitionStore(tmp_path / f"p{n}", cache) for n in range(3)]
    for n, store in enumerate(stores):
        for i in range(4):
            _committed(store, f"p{n}-r{i}")
    assert len(cache) == 5
    assert [cache.held(s._cached) for s in stores] == [0, 1, 4]
    for n, store in enumerate(stores):  # evicted or not, every run is still found
        assert [store.committed_snapshot(f"p{n}-r{i}") is not None for i in range(4)] == [True] * 4
        assert store.committed_snapshot(f"p{(n + 1) % 3}-r0") is None  # not its run
    assert len(cache) == 5
    stores[2].close()
    assert cache.held(stores[2]._cached) == 0 and len(cache) <= 5
    stores[0].close()
    stores[1].close()
    assert len(cache) == 0


def _slow_history_puts(key: bytes, value: bytes | None, header: bytes | None) -> object:
    """What `ChangelogBatch._aside` writes for a history record: the reference."""
    from processor.records.changelog_keys import parse_history_changelog_key
    from processor.runtimes.native.store.changelog import committed_by
    from processor.runtimes.native.store.keys import history_key, proposal_key

    try:
        run_id, revision = parse_history_changelog_key(key)
        if value is None:
            return "delete"
        committed, proposal_id = committed_by(value, header)
        if committed != revision:
            return "unreadable"
        return (
            history_key(run_id, revision),
            proposal_key(run_id, proposal_id),
            str(revision).encode(),
        )
    except (ValueError, KeyError, TypeError):
        return "unreadable"


_HISTORY_BYTES = st.binary(max_size=12) | st.sampled_from(
    [b"", b"\x00", b"\xff\xfe", b"r-1", "é".encode(), b"\xed\xa0\x80"]
)


@settings(max_examples=examples(400), deadline=None)
@given(
    run=_HISTORY_BYTES,
    revision=st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 7, 10]),
    said=st.sampled_from(["same", "other", "text"]) | st.none(),
    spelled=st.sampled_from([b"%d", b"0%d", b"+%d", b" %d", b"%d_0", b"\xd9\xa3"]),
    proposal=_HISTORY_BYTES,
    cut=st.integers(0, 12),
)
def test_history_fast_path_writes_what_the_checked_path_writes(
    run: bytes,
    revision: int,
    said: str | None,
    spelled: bytes,
    proposal: bytes,
    cut: int,
) -> None:
    """Restore builds a history record's store keys from its bytes; for any key and
    header, hostile ones included, it writes what the decoding path writes, or leaves
    the record to that path."""
    import struct

    from processor.runtimes.native.store.changelog import history_puts

    key = HISTORY_CHANGELOG_PREFIX + run + b"\x00" + struct.pack(">Q", revision)
    key = key[: len(key) - cut] if cut > 8 else key
    number = revision if said in (None, "same") else revision + 1
    header = None if said is None else (spelled % number if b"%d" in spelled else spelled)
    if said == "text":
        header = b"seven"
    header = None if header is None else header + b" " + proposal
    value = b'{"revision": %d, "proposal_id": "p"}' % revision
    try:
        fast: object = history_puts(key, value, header)
    except ValueError:  # restore counts the record unreadable
        fast = "unreadable"
    if fast is not None:
        assert fast == _slow_history_puts(key, value, header)
    if said == "same" and spelled == b"%d" and cut == 0 and run and proposal:
        try:
            run.decode(), proposal.decode()
        except UnicodeDecodeError:
            return
        assert fast is not None  # the common record takes the fast path


def test_finished_runs_stay_out_of_the_cache_and_read_back_from_the_store(
    tmp_path: Path,
) -> None:
    """A store given `finished` caches unfinished runs only: a run that finishes drops
    its cached unfinished snapshot (so nothing stale is served), and reads of finished
    runs come from the database every time, current."""
    from processor.engine import is_finished
    from processor.machines import builtin_machines

    machines = builtin_machines()
    cache = SnapshotCache(100)
    store = PartitionStore(
        tmp_path / "p0",
        cache,
        finished=lambda s: is_finished(machines, s.machine, s.machine_version, s.state),
    )
    runs = {f"r{i}": Driver(run_id=f"r{i}") for i in range(6)}
    txn = store.begin()
    for run in runs.values():
        txn.stage(run.create("run_state"))
        txn.stage(run.commit("start"))
    txn.flush({"changelog": 1})
    assert len(cache) == 6  # all running: all cached
    txn = store.begin()
    for name in ("r0", "r1", "r2"):
        txn.stage(runs[name].commit("complete"))
    txn.flush({"changelog": 2})
    assert len(cache) == 3
    for name, run in runs.items():
        assert store.committed_snapshot(name) == run.snapshot
        assert store.committed_snapshot(name) == run.snapshot  # a read caches no finished run
    assert len(cache) == 3
    assert {s.state for s in map(store.committed_snapshot, runs)} == {"completed", "running"}
    store.close()


def test_is_finished_follows_the_machine_that_decides_the_run() -> None:
    from processor.engine import is_finished
    from processor.machines import builtin_machines

    machines = builtin_machines()
    assert is_finished(machines, "run_state", None, "completed")
    assert not is_finished(machines, "run_state", None, "running")
    assert not is_finished(machines, "no_such_machine", None, "completed")
    version = machines["run_state"].version
    assert is_finished(machines, "run_state", version, "timeout")
    assert not is_finished(machines, "run_state", "not-held", "completed")
