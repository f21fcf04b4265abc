"""The Faust runtime's timers: its in-memory due index and the punctuator over its table
(no broker, no Faust app)."""

import pytest

from processor.kafka.topics import TopicNames
from processor.records.changelog_keys import FIRED_CHANGELOG_PREFIX
from processor.records.punctuator import Fired, Punctuator
from processor.runtimes.faust.timers import DueIndex, TableTimers, fired_key
from processor.trust.keyring import SigningKey
from schemas.messages import RunSnapshot, Timer


def snapshot(run_id: str, revision: int, *dues: tuple[str, int]) -> RunSnapshot:
    return RunSnapshot(
        run_id=run_id,
        machine="task_lifecycle",
        state="paused",
        revision=revision,
        entered_state_at_ms=0,
        updated_at_ms=0,
        created_at_ms=0,
        timers=[
            Timer(kind="deadline", name=name, due_at_ms=due, event="timeout", revision=revision)
            for name, due in dues
        ],
    )


class Table:
    """A partition view over plain dicts."""

    def __init__(self) -> None:
        self.data: dict[int, dict[bytes, bytes]] = {}

    def partition_get(self, partition: int, key: bytes) -> bytes | None:
        return self.data.get(partition, {}).get(key)

    def partition_put(self, partition: int, key: bytes, value: bytes) -> None:
        self.data.setdefault(partition, {})[key] = value

    def write(self, partition: int, snap: RunSnapshot) -> None:
        self.partition_put(partition, snap.run_id.encode(), snap.model_dump_json().encode())


def test_rebuild_reads_snapshots_only_and_leaves_fired_timers_out() -> None:
    table = Table()
    table.write(0, snapshot("a", 3, ("approval", 100)))
    table.write(0, snapshot("b", 1, ("approval", 200), ("heartbeat", 50)))
    table.write(0, snapshot("c", 0))  # no timers
    # b's heartbeat fired at its revision; a's mark is of an older revision: moot
    table.partition_put(0, fired_key("b"), Fired(1, frozenset({"heartbeat@50"})).encode())
    table.partition_put(0, fired_key("a"), Fired(2, frozenset({"approval@100"})).encode())
    table.partition_put(0, b"\x00next-offset\x00", b"17")  # the local offset mark
    index = DueIndex()
    assert not index.indexed(0)
    runs = index.rebuild(0, table.data[0].items())  # where each run is, for GET /runs
    assert sorted((r.run_id, r.machine, r.state, r.entered_ms) for r in runs) == [
        (run_id, "task_lifecycle", "paused", 0) for run_id in "abc"
    ]
    assert index.size(0) == 2
    assert index.due_runs(0, 99) == []
    assert index.due_runs(0, 150) == ["a"]  # b's heartbeat (50) fired already
    assert index.due_runs(0, 150) == []  # taken out
    assert index.due_runs(0, 1_000) == ["b"]
    assert index.size(0) == 0


def test_a_commit_replaces_the_runs_timers_and_old_entries_go_stale() -> None:
    index = DueIndex()
    index.rebuild(0, [])
    index.note(0, snapshot("a", 1, ("approval", 100)))
    index.note(0, snapshot("a", 2, ("heartbeat", 300)))  # the approval no longer applies
    assert index.due_runs(0, 200) == []
    assert index.due_runs(0, 300) == ["a"]
    index.note(1, snapshot("x", 0, ("approval", 1)))  # partition not indexed: left to rebuild
    assert not index.indexed(1) and index.due_runs(1, 10) == []


def test_stale_entries_do_not_pile_up() -> None:
    index = DueIndex()
    index.rebuild(0, [])
    for revision in range(20_000):
        index.note(0, snapshot("busy", revision, ("heartbeat", 10_000_000 + revision)))
    assert len(index._partitions[0].heap) <= 4 * 1 + 1024 + 1


def test_punctuator_over_the_table_marks_each_timer_once() -> None:
    table = Table()
    run = snapshot("r1", 4, ("approval", 100))
    table.write(2, run)
    punctuator = Punctuator(TopicNames.with_prefix("t."), SigningKey.hmac("runtime", "s" * 16))
    index = DueIndex()
    index.rebuild(2, table.data[2].items())
    state = TableTimers(table, 2)
    firings = list(punctuator.fire(150, state, index.due_runs(2, 150)))
    assert [f.timer.name for f in firings] == ["approval"]
    topics = [r.topic for r in firings[0].records]
    assert topics == ["t.proposals", "t.runs-changelog"]
    mark = firings[0].records[-1]
    assert mark.key == FIRED_CHANGELOG_PREFIX + b"r1"
    assert table.partition_get(2, fired_key("r1")) is None  # not before it is delivered
    state.persist("r1")
    assert Fired.decode(table.data[2][fired_key("r1")]).covers(4, "approval", 100)
    # read back after a restart: rebuilt from the table, nothing is due again
    again = DueIndex()
    again.rebuild(2, table.data[2].items())
    assert again.due_runs(2, 10_000) == []
    assert list(punctuator.fire(10_000, TableTimers(table, 2), ["r1"])) == []


def test_a_run_whose_snapshot_cannot_be_read_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stored snapshot that raises on reading (nested past the parser's limit) must
    not crash the punctuator on every tick (the worker would restart in a loop): that
    run's timers are skipped and said once; the others fire."""
    table = Table()
    for run_id in ("bad", "good"):
        table.write(2, snapshot(run_id, 4, ("approval", 100)))
    state = TableTimers(table, 2)

    class Unreadable:
        def snapshot(self, run_id: str) -> RunSnapshot | None:
            if run_id == "bad":
                raise ValueError("recursion limit exceeded")
            return state.snapshot(run_id)

        def __getattr__(self, name: str) -> object:
            return getattr(state, name)

    punctuator = Punctuator(TopicNames.with_prefix("t."), SigningKey.hmac("runtime", "s" * 16))
    for _ in range(3):
        firings = list(punctuator.fire(150, Unreadable(), ["bad", "good"]))  # type: ignore[arg-type]
        assert [f.snapshot.run_id for f in firings] == (["good"] if _ == 0 else [])
        state.persist("good")
    said = [r for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(said) == 1 and "bad" in said[0].getMessage()
