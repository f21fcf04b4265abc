"""Analytics without a broker: the column mapping of `runstate export`, its Parquet files
and offsets file, and the example queries' rules (visits, lives of a run id, copies)."""

import importlib.util
import json
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import KafkaError, TopicPartition

from processor.analytics import reader as reader_module
from processor.analytics.columns import (
    REJECTION_COLUMNS,
    TRANSITION_COLUMNS,
    rejection_row,
    transition_row,
)
from processor.analytics.parquet import (
    PartWriter,
    arrow_schema,
    load_offsets,
    next_part,
    part_path,
    save_offsets,
)
from processor.analytics.reader import ReadError, TransitionReader
from processor.kafka.config import KafkaSettings
from processor.kafka.topics import TopicNames
from schemas.codes import RejectionCode
from schemas.messages import Principal, Rejection, Transition

ROOT = Path(__file__).resolve().parents[2]


def _transition(
    run_id: str, revision: int, from_state: str | None, to: str, **kw: Any
) -> Transition:
    fields: dict[str, Any] = {
        "transition_id": f"{run_id}:{revision}",
        "run_id": run_id,
        "machine": "owned_run",
        "revision": revision,
        "from_state": from_state,
        "to_state": to,
        "event": "create" if from_state is None else f"to_{to}",
        "proposal_id": f"p-{run_id}-{revision}",
        "principal": Principal(source="runtime", authority="runtime"),
        "at_ms": 1_000 * revision,
    }
    return Transition(**(fields | kw))


def test_transition_row_is_flat_and_typed() -> None:
    t = _transition(
        "refund-42",
        3,
        "running",
        "failed",
        machine_version="v7",
        event="run_failed",
        reason="tool_error",
        retry_count=2,
        principal=Principal(source="tool:charge", authority="tool_executor"),
        payload={"fact": "café", "n": [1, {"b": None}]},
        metadata={"trace": "abc"},
        at_ms=1_764_000_000_123,
    )
    row = transition_row(4, 981, t)
    assert list(row) == list(TRANSITION_COLUMNS)
    assert row == {
        "run_id": "refund-42",
        "transition_id": "refund-42:3",
        "machine": "owned_run",
        "machine_version": "v7",
        "revision": 3,
        "from_state": "running",
        "to_state": "failed",
        "event": "run_failed",
        "proposal_id": "p-refund-42-3",
        "principal_source": "tool:charge",
        "principal_authority": "tool_executor",
        "reason": "tool_error",
        "retry_count": 2,
        "at_ms": 1_764_000_000_123,
        "payload": '{"fact":"café","n":[1,{"b":null}]}',
        "metadata": '{"trace":"abc"}',
        "partition": 4,
        "offset": 981,
    }
    assert json.loads(row["payload"]) == t.payload
    create = transition_row(0, 0, _transition("r", 0, None, "queued"))
    assert create["from_state"] is None and create["machine_version"] is None
    assert create["reason"] is None and create["payload"] == "{}"


def test_rejection_row_with_and_without_a_principal() -> None:
    refused = Rejection(
        code=RejectionCode.DUPLICATE_STEP,
        detail="step charge already succeeded",
        run_id="refund-42",
        proposal_id="p-9",
        event="step_succeeded",
        principal=Principal(source="runtime", authority="runtime"),
        state="running",
        revision=5,
        step_result={"id": 7},
        at_ms=77,
    )
    row = rejection_row(1, 2, refused)
    assert list(row) == list(REJECTION_COLUMNS)
    assert row == {
        "code": "duplicate_step",
        "detail": "step charge already succeeded",
        "run_id": "refund-42",
        "proposal_id": "p-9",
        "event": "step_succeeded",
        "principal_source": "runtime",
        "principal_authority": "runtime",
        "state": "running",
        "revision": 5,
        "original_transition_id": None,
        "step_result": '{"id":7}',
        "at_ms": 77,
        "partition": 1,
        "offset": 2,
    }
    anonymous = rejection_row(
        0, 9, Rejection(code=RejectionCode.SCHEMA_INVALID, detail="x", at_ms=1)
    )
    assert anonymous["principal_source"] is None and anonymous["principal_authority"] is None
    assert anonymous["run_id"] is None and anonymous["step_result"] is None


@pytest.mark.parametrize("kind", ["transitions", "rejections"])
def test_the_arrow_schema_takes_the_rows(kind: str) -> None:
    rows = (
        [transition_row(0, 1, _transition("r", 0, None, "queued"))]
        if kind == "transitions"
        else [rejection_row(0, 1, Rejection(code=RejectionCode.UNKNOWN_RUN, detail="d", at_ms=3))]
    )
    table = pa.Table.from_pylist(rows, schema=arrow_schema(kind))
    assert table.to_pylist() == rows
    assert table.schema.field("offset").type == pa.int64()
    assert table.schema.field("partition").type == pa.int32()


def test_part_files_are_numbered_and_written_only_with_rows(tmp_path: Path) -> None:
    assert next_part(tmp_path) == 1
    empty = PartWriter(part_path(tmp_path, "rejections", 1), "rejections")
    assert empty.close() is None and not list(tmp_path.iterdir())
    writer = PartWriter(part_path(tmp_path, "transitions", 1), "transitions", batch=2)
    for revision in range(5):  # three row groups
        writer.add(transition_row(0, revision, _transition("r", revision, None, "queued")))
    path = writer.close()
    assert path == tmp_path / "transitions-00001.parquet"
    assert [p.name for p in tmp_path.iterdir()] == ["transitions-00001.parquet"]  # no .tmp
    assert pq.read_table(path).column("offset").to_pylist() == [0, 1, 2, 3, 4]
    assert next_part(tmp_path) == 2


def test_offsets_file_round_trip_keeps_topics_not_read(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    both = {"transitions": "x.transitions", "rejections": "x.rejections"}
    assert load_offsets(path, both) == {}
    save_offsets(path, {"transitions": {0: 5, 1: 0}, "rejections": {0: 2}}, both)
    # an export with --no-rejections moves the transitions and keeps the rejections' place
    save_offsets(path, {"transitions": {0: 9, 1: 4}}, {"transitions": "x.transitions"})
    assert load_offsets(path, both) == {"transitions": {0: 9, 1: 4}, "rejections": {0: 2}}
    # another topic prefix starts from the beginning
    assert load_offsets(path, {"transitions": "y.transitions"}) == {"transitions": {}}
    path.write_text('{"offsets": 1}')
    with pytest.raises(ValueError, match="not an offsets file"):
        load_offsets(path, both)


# -- the example queries, on files made here ---------------------------------------------
def _query_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "analytics_query", ROOT / "examples" / "analytics" / "query.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(folder: Path, part: int, kind: str, rows: list[dict[str, Any]]) -> None:
    writer = PartWriter(part_path(folder, kind, part), kind)
    for row in rows:
        writer.add(row)
    writer.close()


def test_queries_count_visits_lives_and_copies_as_documented(tmp_path: Path) -> None:
    def t(run: str, rev: int, src: str | None, to: str, ms: int, **kw: Any) -> Transition:
        return _transition(run, rev, src, to, at_ms=ms, **kw)

    lives = [
        # a: queued 100 ms; running 300 ms across a self-transition (one visit); failed
        t("a", 0, None, "queued", 0),
        t("a", 1, "queued", "running", 100),
        t("a", 2, "running", "running", 250, event="tool_result"),
        t("a", 3, "running", "failed", 400, event="run_failed", reason="tool_error"),
        # the same run id again after retention: a new life, not a 10 s stay in failed
        t("a", 0, None, "queued", 10_400),
        t("a", 1, "queued", "running", 10_450),
    ]
    rows = [transition_row(0, offset, x) for offset, x in zip(range(10, 99), lives, strict=False)]
    _write(tmp_path, 1, "transitions", rows[:3])
    # the second file repeats the first's last record (an export stopped before saving
    # its offsets) and a Faust-style copy at another offset
    copy = dict(rows[3], offset=50)
    _write(tmp_path, 2, "transitions", [rows[2], *rows[3:], copy])
    principal = Principal(source="tool:x", authority="tool_executor")
    refused = [
        Rejection(
            code=RejectionCode.UNAUTHORIZED, detail="d", run_id=r, principal=principal, at_ms=1
        )
        for r in ("a", "a", "b")
    ] + [Rejection(code=RejectionCode.SCHEMA_INVALID, detail="d", at_ms=2)]
    _write(tmp_path, 1, "rejections", [rejection_row(1, n, r) for n, r in enumerate(refused)])
    _write(tmp_path, 2, "rejections", [rejection_row(1, 0, refused[0])])  # again

    query = _query_module()
    db = query.connect(tmp_path)
    queries = query.load_queries()
    visits = {(r["machine"], r["state"]): r for r in query.run(db, queries["time_in_state"])}
    assert {k: (v["visits"], v["total_ms"]) for k, v in visits.items()} == {
        ("owned_run", "queued"): (2, 100 + 50),
        ("owned_run", "running"): (1, 300),
    }
    assert query.run(db, queries["failures"]) == [
        {
            "machine": "owned_run",
            "failed_as": "failed",
            "from_state": "running",
            "event": "run_failed",
            "reason": "tool_error",
            "event_before": "tool_result",
            "runs": 1,
        }
    ]
    assert query.run(db, queries["refusals"]) == [
        {
            "code": "unauthorized",
            "principal_authority": "tool_executor",
            "principal_source": "tool:x",
            "refusals": 3,
            "runs": 2,
        },
        {
            "code": "schema_invalid",
            "principal_authority": None,
            "principal_source": None,
            "refusals": 1,
            "runs": 0,
        },
    ]


# -- the reader's positions, over a fake consumer -----------------------------------------
class _Msg:
    def __init__(self, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        self._where = (topic, partition, offset)
        self._value = value

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> Any:
        if self._value is not None:
            return None
        return KafkaError(KafkaError._PARTITION_EOF)


class _FakeConsumer:
    """One partition per topic: `logs[topic]` is (low, high at the start, records
    delivered in order: (offset, value), or (offset, None) for the end of the partition
    reached at that offset)."""

    logs: ClassVar[dict[str, tuple[int, int, list[tuple[int, bytes | None]]]]] = {}

    def __init__(self, config: dict[str, Any]) -> None:
        assert config["isolation.level"] == "read_committed"
        self.assigned: list[TopicPartition] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        meta = SimpleNamespace(partitions={0: None}, error=None)
        return SimpleNamespace(topics={topic: meta})

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        low, high, _ = self.logs[tp.topic]
        return low, high

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = tps

    def consume(self, num_messages: int, timeout: float) -> list[_Msg]:
        out = []
        for tp in self.assigned:
            _, _, records = self.logs[tp.topic]
            for offset, value in records:
                if value is None or offset >= tp.offset:
                    out.append(_Msg(tp.topic, 0, offset, value))
        self.assigned = []  # delivered once
        return out

    def close(self) -> None:
        pass


def _raw(t: Transition) -> bytes:
    return t.model_dump_json().encode()


def test_reader_positions_gaps_and_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader_module, "Consumer", _FakeConsumer)
    topics = TopicNames.with_prefix("x.")
    rec = [_raw(_transition("r", n, None if n == 0 else "queued", "queued")) for n in range(6)]
    _FakeConsumer.logs = {
        # offsets 0-1 deleted by retention; 2, 3 data, 4 a commit marker (never delivered),
        # 5 committed after the start (high was 5): not this read's
        topics.transitions: (2, 5, [(2, rec[2]), (3, rec[3]), (5, rec[5])]),
        # the end reached past a marker: the position moves to the end
        topics.rejections: (0, 2, [(2, None)]),
    }
    start = {"transitions": {0: 1}}
    with TransitionReader(
        KafkaSettings("x:1"), topics, positions_from=start, rejections=True
    ) as reader:
        assert reader.remaining() == 3 + 2
        got = [(p, o, r.transition_id) for p, o, r in reader]  # type: ignore[union-attr]
        assert got == [(0, 2, "r:2"), (0, 3, "r:3")]
        assert reader.positions() == {"transitions": {0: 5}, "rejections": {0: 2}}
        assert [(g.kind, g.stored, g.low, g.lost) for g in reader.gaps] == [
            ("transitions", 1, 2, 1)
        ]
    with pytest.raises(ReadError, match="past the end"):
        TransitionReader(KafkaSettings("x:1"), topics, positions_from={"transitions": {0: 9}})


def test_reader_refuses_a_record_that_is_not_a_transition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader_module, "Consumer", _FakeConsumer)
    topics = TopicNames.with_prefix("x.")
    _FakeConsumer.logs = {topics.transitions: (0, 1, [(0, b'{"nope": 1}')])}
    with (
        TransitionReader(KafkaSettings("x:1"), topics) as reader,
        pytest.raises(ReadError, match=r"x\.transitions\[0\]@0: not a transition"),
    ):
        list(reader)
