"""`runstate export` to Parquet, twice (the second writes only what is new), and the
example queries of examples/analytics over the files, against answers computed here
from what the worker published."""

import importlib.util
import itertools
import json
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, TopicPartition

from processor.analytics.columns import rejection_row, transition_row
from processor.analytics.reader import TransitionReader
from processor.history.rebuild import partition_count
from processor.kafka.config import KafkaSettings
from processor.kafka.readback import watermarks
from processor.kafka.topics import TopicNames
from schemas.messages import Transition
from tests.integration.harness import (
    ROOT,
    Env,
    Published,
    WorkerProcess,
    make_env,
    published,
    runstate,
    send,
    wait_for_outcomes,
    workload,
)

FAILURE_STATES = ("failed", "timeout")  # as in queries.sql
FAILURE_COLUMNS = ("machine", "failed_as", "from_state", "event", "reason", "event_before")


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def _query_module() -> ModuleType:
    path = ROOT / "examples" / "analytics" / "query.py"
    spec = importlib.util.spec_from_file_location("analytics_query", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _item(run_id: str, event: str, key: str = "runtime", **fields: Any) -> dict[str, Any]:
    return {"run_id": run_id, "event": event, "key": key, **fields}


def _create(run_id: str, machine: str) -> dict[str, Any]:
    return _item(run_id, "create", payload={"machine": machine, "options": {}})


def _numbered(plan: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    for n, item in enumerate(plan):
        item.setdefault("proposal_id", f"{prefix}-{n}")
    return plan


def _first_plan() -> list[dict[str, Any]]:
    """Failures of each built-in machine, refusals of several codes and principals, a
    state left and entered again by a self-transition, and a run left running for the
    second export to finish."""
    plan = [
        _create("own-fail", "owned_run"),
        _item("own-fail", "run_started"),
        _item("own-fail", "tool_result", "tool", payload={"fact": "build=red"}),
        _item("own-fail", "run_failed"),  # reason_required
        _item("own-fail", "run_failed", reason="tool_error"),
        _item("own-fail", "run_started"),  # terminal_state
        _create("own-wait", "owned_run"),
        _item("own-wait", "run_started"),
        _item("own-wait", "run_waiting", reason="external_callback"),
        _item("own-wait", "run_failed", reason="tool_error"),
        _create("rs-fail", "run_state"),
        _item("rs-fail", "start"),
        _item("rs-fail", "approved", "approver"),  # invalid_transition
        _item("rs-fail", "fail"),
        _create("tl-fail", "task_lifecycle"),
        _item("tl-fail", "start"),
        _item("tl-fail", "approval_granted", "model"),  # unauthorized
        _item("tl-fail", "fatal_error", "tool"),
        _item("nobody", "start"),  # unknown_run
        _create("own-live", "owned_run"),
        _item("own-live", "run_started"),
        _item("own-live", "tool_result", "tool", payload={"fact": "build=green"}),
    ]
    return _numbered(plan, "a") + workload(runs=24, proposals=240, seed=61)


def _second_plan() -> list[dict[str, Any]]:
    plan = [
        _item("own-live", "run_failed", reason="tool_error"),
        _create("rs-fail-2", "run_state"),
        _item("rs-fail-2", "start"),
        _item("rs-fail-2", "fail"),
        _item("rs-fail-2", "start", "model"),  # unauthorized before terminal_state
    ]
    return _numbered(plan, "b") + workload(runs=12, proposals=120, seed=62)


def _export(env: Env, out: Path) -> dict[str, Any]:
    result = runstate(env, "export", "--out", str(out))
    assert result.returncode == 0, result.stderr
    summary: dict[str, Any] = json.loads(result.stdout)
    return summary


def _ends(env: Env) -> dict[str, dict[str, int]]:
    consumer = Consumer({"bootstrap.servers": env.bootstrap, "group.id": "analytics-ends"})
    try:
        return {
            topic: {
                str(p): watermarks(consumer, TopicPartition(topic, p))[1]
                for p in range(partition_count(KafkaSettings(env.bootstrap), topic))
            }
            for topic in (env.topics.transitions, env.topics.rejections)
        }
    finally:
        consumer.close()


def _rows(path: str | None) -> list[dict[str, Any]]:
    return [] if path is None else pq.read_table(path).to_pylist()


# -- the answers, from the published records --------------------------------------------
def _lives(transitions: list[Transition]) -> list[list[Transition]]:
    """Each run's transitions in commit order (read order: one partition per run), split
    where a create starts the run id again."""
    by_run: dict[str, list[list[Transition]]] = defaultdict(list)
    for t in transitions:
        if t.from_state is None or not by_run[t.run_id]:
            by_run[t.run_id].append([])
        by_run[t.run_id][-1].append(t)
    return [life for lives in by_run.values() for life in lives]


def _time_in_state(result: Published) -> dict[tuple[str, str], list[int]]:
    visits: dict[tuple[str, str], list[int]] = defaultdict(list)
    for life in _lives(result.transitions):
        entries = [t for i, t in enumerate(life) if i == 0 or life[i - 1].to_state != t.to_state]
        for entered, left in itertools.pairwise(entries):
            visits[(entered.machine, entered.to_state)].append(left.at_ms - entered.at_ms)
    return visits


def _failures(result: Published) -> Counter[tuple[Any, ...]]:
    found: Counter[tuple[Any, ...]] = Counter()
    for life in _lives(result.transitions):
        for before, t in itertools.pairwise(life):
            if t.to_state in FAILURE_STATES:
                key = (t.machine, t.to_state, t.from_state, t.event, t.reason, before.event)
                found[key] += 1
    return found


def _refusals(result: Published) -> dict[tuple[Any, ...], tuple[int, int]]:
    count: Counter[tuple[Any, ...]] = Counter()
    runs: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    for r in result.rejections:
        p = r.principal
        key = (r.code.value, p and p.authority, p and p.source)
        count[key] += 1
        if r.run_id is not None:
            runs[key].add(r.run_id)
    return {key: (n, len(runs[key])) for key, n in count.items()}


def test_export_twice_and_the_example_queries(env: Env) -> None:
    out = env.tmp / "export"
    worker = WorkerProcess(env, env.tmp / "w1")
    try:
        worker.wait_ready(partitions=3)
        first = _first_plan()
        send(env, first)
        wait_for_outcomes(env, first, timeout=60)
        one = _export(env, out)
        second = _second_plan()
        send(env, second)
        wait_for_outcomes(env, second, timeout=60)
    finally:
        # Stopped before the second export: no retry deadline commits after it, so the
        # two exports together must be everything published.
        assert worker.terminate() == 0, worker.log()
    two = _export(env, out)
    three = _export(env, out)
    result = published(env)

    # The files: one per kind and export, the second only with what the first had not.
    assert Path(one["transitions"]["file"]).name == "transitions-00001.parquet"
    assert Path(two["transitions"]["file"]).name == "transitions-00002.parquet"
    assert Path(two["rejections"]["file"]).name == "rejections-00002.parquet"
    assert three["transitions"] == {"records": 0, "file": None}
    assert three["rejections"] == {"records": 0, "file": None}
    assert three["positions"] == two["positions"] == _ends(env)  # past the commit markers
    assert one["lost_to_retention"] == two["lost_to_retention"] == []
    transitions = _rows(one["transitions"]["file"]) + _rows(two["transitions"]["file"])
    rejections = _rows(one["rejections"]["file"]) + _rows(two["rejections"]["file"])
    assert one["transitions"]["records"] > 0 and two["transitions"]["records"] > 0
    assert len(transitions) == one["transitions"]["records"] + two["transitions"]["records"]
    for kind, rows in (("transitions", transitions), ("rejections", rejections)):
        where = [(r["partition"], r["offset"]) for r in rows]
        assert len(set(where)) == len(where), f"{kind}: a record exported twice"
        first_end = one["positions"][getattr(env.topics, kind)]
        for r in _rows(two[kind]["file"]):
            assert r["offset"] >= first_end[str(r["partition"])], f"{kind}: {r} again"

    # The reader behind it, following from the first export's positions, yields what
    # the second exported, then keeps waiting (the caller stops it).
    names = {"transitions": env.topics.transitions, "rejections": env.topics.rejections}
    start = {k: {int(p): n for p, n in one["positions"][t].items()} for k, t in names.items()}
    want = two["transitions"]["records"] + two["rejections"]["records"]
    seen: list[tuple[int, int]] = []
    with TransitionReader(
        KafkaSettings(env.bootstrap),
        env.topics,
        positions_from=start,
        rejections=True,
        follow=True,
        poll_timeout=0.2,
    ) as reader:
        deadline = time.monotonic() + 30
        for partition, offset, _ in reader:
            seen.append((partition, offset))
            if len(seen) == want or time.monotonic() > deadline:
                break
        assert len(seen) == want
        followed = reader.positions()
    # Following, the positions are just past the last record yielded: at most the
    # transaction's commit marker behind the end an export's stop takes.
    for kind, topic in names.items():
        for p, end in two["positions"][topic].items():
            assert 0 <= end - followed[kind][int(p)] <= 1, (topic, p)

    # ... and together exactly what was published, column for column.
    def _sans_place(row: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in row.items() if k not in ("partition", "offset")}

    published_t = [_sans_place(transition_row(0, 0, t)) for t in result.transitions]
    assert sorted(map(_key, map(_sans_place, transitions))) == sorted(map(_key, published_t))
    published_r = [_sans_place(rejection_row(0, 0, r)) for r in result.rejections]
    assert sorted(map(_key, map(_sans_place, rejections))) == sorted(map(_key, published_r))
    assert {r["code"] for r in rejections} >= {
        "reason_required",
        "terminal_state",
        "invalid_transition",
        "unauthorized",
        "unknown_run",
    }

    # The example queries, over both exports' files, give the answers computed here.
    query = _query_module()
    queries = query.load_queries()
    assert set(queries) == {"time_in_state", "failures", "refusals"}
    db = query.connect(out)

    visits = _time_in_state(result)
    got = {(r["machine"], r["state"]): r for r in query.run(db, queries["time_in_state"])}
    assert set(got) == set(visits)
    for key, spans in visits.items():
        row = got[key]
        assert (row["visits"], row["total_ms"], row["max_ms"]) == (
            len(spans),
            sum(spans),
            max(spans),
        ), key
        assert row["avg_ms"] == pytest.approx(statistics.mean(spans))
        assert row["p50_ms"] == pytest.approx(statistics.median(spans))
    # own-live entered running in the first export and left it in the second: the visit
    # spans both files and counts once.
    first_ids = {r["transition_id"] for r in _rows(one["transitions"]["file"])}
    assert "own-live:1" in first_ids and "own-live:3" not in first_ids
    assert ("owned_run", "running") in got

    failures = Counter(
        {
            tuple(r[c] for c in FAILURE_COLUMNS): r["runs"]
            for r in query.run(db, queries["failures"])
        }
    )
    assert failures == _failures(result)
    for machine in ("owned_run", "run_state", "task_lifecycle"):
        assert any(key[0] == machine for key in failures), machine
    assert failures[("owned_run", "failed", "running", "run_failed", "tool_error", "tool_result")]

    refusals = {
        (r["code"], r["principal_authority"], r["principal_source"]): (r["refusals"], r["runs"])
        for r in query.run(db, queries["refusals"])
    }
    assert refusals == _refusals(result)


def _key(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=str)
