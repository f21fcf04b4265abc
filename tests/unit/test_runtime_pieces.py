"""Runtime pieces that need no broker: partitioning, keyrings, the record pipeline, stores."""

import json
import platform
import sys
from pathlib import Path

import pytest

from processor.engine import Commit
from processor.engine.answers import committed_digest
from processor.kafka.partitioning import murmur2, partition_for
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines
from processor.records.outputs import Source, outcome_records
from processor.records.pipeline import DeadLetterReason, decide_record
from processor.runtimes.native.heap import IdleTrim, malloc_trim
from processor.runtimes.native.store.partition import PartitionStore
from processor.trust.keygen import generate_keyring
from processor.trust.keyring import KeyringError, SigningKey, dump_keyring, load_keyring
from schemas import Proposal, Rejection, RejectionCode


def _signed(n: int) -> int:
    return n - (1 << 32) if n >= 1 << 31 else n


def test_murmur2_matches_kafkas_test_vectors() -> None:
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2
    vectors = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for data, expected in vectors.items():
        assert _signed(murmur2(data)) == expected
    assert all(0 <= partition_for(f"run-{i}", 6) < 6 for i in range(100))


def test_keyring_generate_dump_load(tmp_path: Path) -> None:
    keyring = generate_keyring()
    path = tmp_path / "k.json"
    path.write_text(dump_keyring(keyring))
    assert load_keyring(path, None) == keyring
    assert load_keyring(None, dump_keyring(keyring)) == keyring
    assert {e.authority for e in keyring.keys.values()} == {
        "runtime",
        "tool_executor",
        "model",
        "approver",
    }
    with pytest.raises(KeyringError, match="runstate keys generate"):
        load_keyring(None, None)
    with pytest.raises(KeyringError, match="is not a keyring"):
        load_keyring(None, '{"keys": {"a": {"secret": "short"}}}')
    with pytest.raises(KeyringError, match="cannot read"):
        load_keyring(tmp_path / "missing.json", None)


def _record(**fields: object) -> bytes:
    return (
        Proposal.model_validate({"proposal_id": "p1", "run_id": "r1", "event": "create", **fields})
        .model_dump_json(exclude_none=True)
        .encode()
    )


def test_pipeline_outcomes() -> None:
    keyring = generate_keyring()
    secret = keyring.keys["runtime"].secret
    machines = builtin_machines()
    value = _record(payload={"machine": "run_state"})

    def run(key: bytes | None, raw: bytes | None, headers: object) -> object:
        return decide_record(
            key,
            raw,
            headers,
            1_000,
            topic="runstate.proposals",
            keyring=keyring,
            machines=machines,
            lookup=lambda _: None,
            seen=lambda _run, _proposal: None,
            placement=None,
        )

    runtime = SigningKey.hmac("runtime", secret or "")

    def signed(key: bytes, raw: bytes) -> object:
        return runtime.headers("runstate.proposals", key, raw, 5)

    assert isinstance(run(b"r1", value, signed(b"r1", value)), Commit)
    assert isinstance(run(b"r1", b"\x00", []), DeadLetterReason)
    wrong_key = run(b"other", value, signed(b"other", value))
    assert isinstance(wrong_key, Rejection) and "key must be the run_id" in wrong_key.detail
    unsigned = run(b"r1", value, [])
    assert isinstance(unsigned, Rejection) and unsigned.code is RejectionCode.UNAUTHENTICATED
    bad = json.dumps({"proposal_id": "p1", "run_id": "r1", "event": 3}).encode()
    invalid = run(b"r1", bad, [])
    assert isinstance(invalid, Rejection) and invalid.code is RejectionCode.SCHEMA_INVALID


def _changelog(commit: Commit) -> list[tuple[bytes, bytes | None, bytes | None]]:
    """The changelog records the worker writes for a commit, as restore reads them."""
    source = Source("proposals", 0, 0, None, None, 0)
    return [
        (r.key or b"", r.value, next((v for _, v in r.headers or []), None))  # type: ignore[misc]
        for r in outcome_records(TopicNames.with_prefix(), commit, source)
        if r.topic == TopicNames.with_prefix().changelog
    ]


def test_store_stages_until_flush_and_restores(tmp_path: Path) -> None:
    from tests.unit.driver import Driver

    run = Driver(run_id="r/1")
    create = run.create("task_lifecycle")
    start = run.commit("start")
    store = PartitionStore(tmp_path / "p0")
    txn = store.begin()
    txn.stage(create)
    txn.stage(start)
    assert txn.snapshot("r/1") == start.snapshot  # the engine sees staged state
    assert store.committed_snapshot("r/1") is None  # queries do not
    txn.flush({"changelog": 2, "transitions": 2})
    assert store.committed_snapshot("r/1") == start.snapshot
    assert [t.revision for t in store.history("r/1")] == [0, 1]
    assert store.offset("changelog") == 2
    aborted = store.begin()
    aborted.stage(run.commit("complete"))
    del aborted  # an aborted transaction is dropped whole
    assert store.begin().snapshot("r/1") == start.snapshot
    store.close()

    reopened = PartitionStore(tmp_path / "p0")
    assert reopened.committed_snapshot("r/1") == start.snapshot
    other = Driver(run_id="r/10")
    created = other.create("run_state")
    reopened.restore([*_changelog(created), (b"r/1", None)], {"changelog": 9})
    assert reopened.committed_snapshot("r/1") is None  # tombstone: the run was forgotten
    assert reopened.history("r/1") == [] and reopened.seen("r/1", "p1") is None
    assert [s.run_id for s in reopened.runs()] == ["r/10"]
    assert [t.run_id for t in reopened.history("r/10")] == ["r/10"]  # prefix-safe
    answer = reopened.seen("r/10", created.transition.proposal_id)
    assert answer is not None and answer.revision == 0
    assert answer.digest == committed_digest(created.transition)
    assert reopened.offset("changelog") == 9
    reopened.close()


def test_restore_builds_the_same_store_as_live_commits(tmp_path: Path) -> None:
    from tests.unit.driver import Driver

    """Restore decodes only what its indexes need (the latest snapshot's timers, each
    transition's revision): the store it builds must equal the one live commits built,
    also when a payload carries a field named `revision`."""
    run = Driver(run_id="r/2")
    commits = [
        run.create("task_lifecycle"),
        run.commit("start", payload={"revision": 99, "note": '"revision":7'}),
        run.commit("pause_for_approval"),  # arms the approval deadline
    ]
    assert commits[-1].snapshot.timers, "the test needs a run with a timer"
    live = PartitionStore(tmp_path / "live")
    txn = live.begin()
    for commit in commits:
        txn.stage(commit)
    txn.flush({})
    restored = PartitionStore(tmp_path / "restored")
    restored.restore([record for c in commits for record in _changelog(c)], {})
    far = 2**62
    for store in (live, restored):
        assert store.committed_snapshot("r/2") == commits[-1].snapshot
        assert [t.revision for t in store.history("r/2")] == [0, 1, 2]
    assert restored.history("r/2") == live.history("r/2")
    armed = {t.due_at_ms for t in commits[-1].snapshot.timers}
    assert restored.due_runs(far) == live.due_runs(far) == ["r/2"] * len(armed)
    live.close()
    restored.close()


def test_by_state_index_pages_longest_in_state_first(tmp_path: Path) -> None:
    """The by-state index follows runs as they move, live and restored alike, and a
    cursor walks it page by page."""
    from tests.unit.driver import APPROVER, Driver

    store = PartitionStore(tmp_path / "p")
    runs = {}
    txn = store.begin()
    for n in range(5):
        run = Driver(run_id=f"s/{n}")
        run.now += n * 1_000  # entered their states one second apart
        run.create("task_lifecycle")
        run.commit("start")
        txn.stage(run.commit("pause_for_approval"))
        runs[run.run_id] = run
    txn.flush({})
    paused = store.in_state("task_lifecycle", "paused", None, 10)
    assert [r.run_id for r in paused] == [f"s/{n}" for n in range(5)]
    first = store.in_state("task_lifecycle", "paused", None, 2)
    rest = store.in_state("task_lifecycle", "paused", (first[-1].entered_ms, first[-1].run_id), 10)
    assert [r.run_id for r in first + rest] == [f"s/{n}" for n in range(5)]
    txn = store.begin()
    txn.stage(
        runs["s/0"].commit("approval_granted", APPROVER, payload=runs["s/0"].decision())
    )  # s/0 leaves paused
    txn.flush({})
    assert store.in_state("task_lifecycle", "paused", None, 1)[0].run_id == "s/1"
    assert [r.run_id for r in store.in_state("task_lifecycle", "running", None, 10)] == ["s/0"]
    # a restore moves the index the same way (here: s/1 back into the changelog as running)
    moved = runs["s/1"].commit("approval_granted", APPROVER, payload=runs["s/1"].decision())
    store.restore([(b"s/1", moved.snapshot.model_dump_json().encode())], {})
    assert {r.run_id for r in store.in_state("task_lifecycle", "running", None, 10)} == {
        "s/0",
        "s/1",
    }
    assert "s/1" not in {r.run_id for r in store.in_state("task_lifecycle", "paused", None, 10)}
    store.close()


def test_cluster_pages_merge_longest_first_with_a_cursor() -> None:
    from processor.serving.peers import merge_runs, merge_stats, parse_cursor

    def run(entered: int, run_id: str) -> dict[str, object]:
        return {"run_id": run_id, "entered_state_at_ms": entered}

    runs, cursor = merge_runs([[run(1, "a"), run(5, "e")], [run(2, "b"), run(3, "c")]], 3)
    assert [r["run_id"] for r in runs] == ["a", "b", "c"] and cursor == "3:c"
    assert parse_cursor(cursor) == (3, "c")
    assert merge_runs([[run(1, "a")]], 3) == ([run(1, "a")], None)
    newest = [[run(5, "e"), run(1, "a")], [run(3, "c"), run(2, "b")]]  # each newest first
    runs, cursor = merge_runs(newest, 3, newest=True)
    assert [r["run_id"] for r in runs] == ["e", "c", "b"] and cursor == "2:b"
    for nonsense in ("nonsense", f"{2**63}:x", "99999999999999999999:x", "-1:x"):
        with pytest.raises(ValueError):
            parse_cursor(nonsense)
    rows = merge_stats(
        [
            [{"machine": "m", "state": "s", "runs": 2, "oldest_entered_ms": 50}],
            [{"machine": "m", "state": "s", "runs": 3, "oldest_entered_ms": 40}],
            [{"machine": "m", "state": "s", "runs": 0, "oldest_entered_ms": None}],
        ]
    )
    assert rows == [{"machine": "m", "state": "s", "runs": 5, "oldest_entered_ms": 40}]


def test_broker_cluster_ids_never_start_with_a_dash() -> None:
    """kafka-storage's argument parser read a leading '-' as an option (found when a
    test broker failed to format)."""
    from processor.broker.server import new_uuid

    ids = [new_uuid() for _ in range(5_000)]  # about 78 would start with '-' unguarded
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(i) == 22 for i in ids)


def test_restore_reads_index_fields_from_the_header_as_from_the_record() -> None:
    """Restore reads a snapshot's index fields from its changelog record's header (not
    decoding the record), and from the record only when it has no header; both agree,
    whatever a step's free-form result holds."""
    from processor.records.changelog_keys import snapshot_index
    from processor.runtimes.native.store.changelog import index_fields
    from tests.unit.driver import Driver

    run = Driver(run_id="f/1")
    run.create("task_lifecycle", deadlines={"heartbeat_timeout_ms": 60_000})
    run.commit("start")
    run.commit("step_started", payload={"step": "s", "idempotency_key": "f/1:s"})
    result = {"state": "x", "machine": "y", "entered_state_at_ms": 1, "timers": []}
    commit = run.commit("step_succeeded", payload={"step": "s", "result": result})
    assert commit.snapshot.timers
    value = commit.snapshot.model_dump_json().encode()
    data = json.loads(value)
    expected = (
        (data["machine"], data["state"], data["entered_state_at_ms"]),
        [(t["due_at_ms"], t["revision"], t["name"]) for t in data["timers"]],
    )
    assert index_fields(value, None) == expected
    assert index_fields(value, snapshot_index(commit.snapshot)) == expected


def test_idle_trim_after_work_and_not_more_often_than_asked() -> None:
    calls: list[int] = []
    heap = IdleTrim(every_s=10.0, trim=lambda pad: calls.append(pad) or 1)
    heap.idle(0, now=100.0)  # nothing done yet: nothing to give back
    assert calls == []
    heap.idle(5, now=101.0)
    assert calls == [0]
    heap.idle(9, now=105.0)  # work since, but only 4 s later
    heap.idle(9, now=120.0)
    assert calls == [0, 0]
    heap.idle(9, now=200.0)  # idle all along since the last trim
    assert calls == [0, 0]


def test_malloc_trim_is_glibcs_on_linux() -> None:
    trim = malloc_trim()
    if sys.platform == "linux" and platform.libc_ver()[0] == "glibc":
        assert trim is not None and trim(0) in (0, 1)
    IdleTrim(trim=None).idle(1, now=0.0)  # found or not, an idle turn never fails


@pytest.mark.parametrize("fails", [False, True])
def test_a_restore_gives_memory_back_when_it_ends(
    monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    """A restore's consumer prefetches up to 256 MB; its thread trims the heap once it
    is done, failed or not (a worker under steady input is never idle to do it)."""
    from processor.kafka.config import KafkaSettings
    from processor.kafka.topics import TopicNames
    from processor.runtimes.native import restore as restore_module

    calls: list[str] = []

    def restored(*args: object, **kwargs: object) -> int:
        calls.append("restore")
        if fails:
            raise RuntimeError("the broker went away")
        return 7

    monkeypatch.setattr(restore_module, "restore_partitions", restored)
    monkeypatch.setattr(restore_module, "give_back", lambda: calls.append("give back"))
    job = restore_module.RestoreJob(KafkaSettings("127.0.0.1:1"), TopicNames.with_prefix("t."), {})
    job._thread.join(10)
    assert job.done and calls == ["restore", "give back"]
    assert (job.error is not None) == fails and job.applied == (0 if fails else 7)
