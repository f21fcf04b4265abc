"""The benchmark's own arithmetic, without a broker: which stage a profiled sample goes
to, how py-spy's raw output is read, how the outcome reader finds a proposal id, and
what answered ÷ offered says of a contender that keeps up and of one that does not."""

from pathlib import Path

import pytest

from benchmarks.measure import Latency, _latency, answer_id
from benchmarks.profile import STAGES, budget, classify, flame_svg, parse_raw
from processor.trust.signatures import Algorithm

pytestmark = pytest.mark.unit


def _frame(func: str, path: str, line: int = 1) -> tuple[str, str, int]:
    return (func, path, line)


LOOP = (
    _frame("Worker.run", "/r/processor/runtimes/native/worker.py"),
    _frame("Worker._step", "/r/processor/runtimes/native/worker.py"),
)


def test_a_sample_goes_to_the_innermost_frame_a_rule_knows() -> None:
    decide = (*LOOP, _frame("decide_record", "/r/processor/records/pipeline.py"))
    # An intake helper no rule names goes to its caller's stage.
    assert classify((*decide, _frame("header_value", "/r/processor/records/intake.py"))) == "decide"
    assert (
        classify((*decide, _frame("decode_proposal", "/r/processor/records/intake.py"))) == "decode"
    )
    assert (
        classify(
            (
                *decide,
                _frame("authenticate", "/r/processor/records/intake.py"),
                _frame("_header", "/r/processor/records/intake.py"),  # a helper: its caller says
            )
        )
        == "authenticate"
    )
    sealed = (*decide, _frame("decide", "/r/processor/engine/decide.py"))
    assert classify(sealed) == "decide"
    assert classify((*sealed, _frame("transition_hash", "/r/schemas/audit.py"))) == "hash"
    assert classify((*sealed, _frame("dumps", "/v/site-packages/rfc8785/_impl.py"))) == "hash"
    lookup = (
        *decide,
        _frame("PartitionTransaction.snapshot", "/r/processor/runtimes/native/store.py"),
    )
    assert classify(lookup) == "stage"
    commit = (*LOOP, _frame("Transaction.commit", "/r/processor/runtimes/native/transaction.py"))
    assert classify(
        (*commit, _frame("PartitionStore.write", "/r/processor/runtimes/native/store.py"))
    ) == ("store flush")
    # A store's modules by job (native/store/), as the one file before them (native/store.py).
    package = "/r/processor/runtimes/native/store/"
    assert classify((*decide, _frame("PartitionTransaction.snapshot", package + "changes.py"))) == (
        "stage"
    )
    assert classify((*decide, _frame("PartitionStore.seen", package + "partition.py"))) == "stage"
    written = (*commit, _frame("PartitionStore.write", package + "partition.py"))
    assert classify(written) == "store flush"
    # Its lookups and index moves while the batch is built are the store flush too.
    assert classify((*written, _frame("reindex", package + "indexes.py"))) == "store flush"
    assert classify((*commit, _frame("PreparedWrite.apply", package + "changes.py"))) == (
        "store flush"
    )
    assert classify((*LOOP, _frame("ChangelogBatch.index", package + "changelog.py"))) == "stage"
    observed = (*commit, _frame("Histogram.observe", "/v/site-packages/prometheus_client/m.py"))
    assert classify(observed) == "metrics"
    logged = (*commit, _frame("Logger.info", "/usr/lib/python3.11/logging/__init__.py"))
    assert classify(logged) == "logs"
    waiting = (
        *commit,
        _frame("TransactionalProducer.commit", "/r/processor/runtimes/native/producer.py"),
        _frame("bounded", "/r/processor/runtimes/native/producer.py"),
        _frame("Event.wait", "/usr/lib/python3.11/threading.py"),
    )
    assert classify(waiting) == "commit"
    assert classify(()) == "other"


def test_the_baseline_commits_flat_layout_is_classified_alike() -> None:
    """The "before" profile is of a commit whose processor/ had no folders by job."""
    flat = "/r/processor/"
    runtime = flat + "runtime/"
    stack = (
        _frame("Worker._step", runtime + "worker.py"),
        _frame("Checkpoint.commit", runtime + "checkpoint.py"),
    )
    assert classify((*stack, _frame("PartitionStore.write", runtime + "store.py"))) == "store flush"
    assert classify(stack) == "commit"
    for module, stage in (
        ("intake", "decode"),
        ("outputs", "encode"),
        ("punctuator", "timers"),
        ("logs", "logs"),
        ("metrics", "metrics"),
        ("signatures", "authenticate"),
    ):
        frame = _frame("decode_proposal", f"{flat}{module}.py")
        assert classify((_frame("Worker._step", runtime + "worker.py"), frame)) == stage


def test_a_c_call_is_known_by_the_line_calling_it(tmp_path: Path) -> None:
    source = tmp_path / "processor" / "runtime" / "producer.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "def commit(self):\n"
        "    self.client.flush(30)\n"
        "    self.client.commit_transaction(30)\n"
        "    self.client.produce(topic, value)\n"
        "    for msg in self.consumer.consume(500, 0.05):\n"
    )
    path = str(source)
    stage = [classify((*LOOP, _frame("commit", path, line))) for line in (2, 3, 4, 5)]
    assert stage == ["producer flush", "commit", "produce", "consume"]


def test_only_the_named_thread_is_read_from_pyspy_raw_output() -> None:
    raw = (
        "thread (7364): MainThread;run (/r/processor/runtimes/native/worker.py:10);"
        "decode_proposal (/r/processor/records/intake.py:20) 30\n"
        "thread (7406): runstate-http;serve_forever (socketserver.py:1) 99\n"
        "thread (7364): MainThread;run (/r/processor/runtimes/native/worker.py:10) 10\n"
        "garbage line\n"
    )
    stacks = parse_raw(raw)
    assert sum(stacks.values()) == 40
    per, samples = budget(stacks, seconds=2.0, proposals=1000)
    assert samples["decode"] == 30 and samples["other"] == 10
    assert list(per) == list(STAGES)
    assert sum(per.values()) == pytest.approx(2.0 / 1000 * 1e6)  # the wall time, shared
    svg = flame_svg(stacks, "a <title>")
    assert svg.startswith("<svg") and "a &lt;title&gt;" in svg and "decode_proposal" in svg


def test_the_reader_finds_the_proposal_id_by_bytes() -> None:
    transition = b'{"schema_version":1,"run_id":"r","proposal_id":"p-9-1","event":"x"}'
    assert answer_id(transition) == b"p-9-1"
    assert answer_id(b'{"code":"conflict","proposal_id":null}') is None
    assert answer_id(None) is None and answer_id(b"") is None


class _Tail:
    def __init__(self) -> None:
        self.visible: list[float] = []
        self.delays: list[float] = []
        self.waiting: dict[bytes, float] = {}


def _feed(rate: float, seconds: float, answer_at: float, per_s: float | None) -> Latency:
    """A feed at `rate` for `seconds` in 2 ms ticks; each answer visible at the next
    100 ms commit after `answer_at` seconds, or at `per_s` answers a second if given."""
    tail, sends, began, sent, tick = _Tail(), [], 1000.0, 0, 0
    while tick * 0.002 < seconds:
        at = began + tick * 0.002
        due = int(tick * 0.002 * rate) + 1
        for n in range(sent, due):
            ready = began + n / per_s if per_s else at + answer_at
            seen = (int(max(ready, at + 0.05) * 10) + 1) / 10
            tail.visible.append(seen)
            tail.delays.append(seen - at)
        sent = due
        sends.append((at, sent))
        tick += 1
    return _latency(tail, sends, seconds, began + seconds, 0.1)  # type: ignore[arg-type]


def test_answered_over_offered_is_one_when_kept_up_whatever_the_delay() -> None:
    assert _feed(1000, 15, 0.2, None).answered_ratio == pytest.approx(1.0, abs=0.01)
    # Answers later than the feed's first second: no lead-in counted as unanswered.
    assert _feed(1000, 3, 0.8, None).answered_ratio == pytest.approx(1.0, abs=0.03)


def test_answered_over_offered_is_the_contenders_rate_when_it_falls_behind() -> None:
    found = _feed(1000, 15, 0.0, per_s=400)
    assert found.answered_ratio == pytest.approx(0.4, abs=0.02)
    assert found.achieved == pytest.approx(400, rel=0.05)
    assert found.p50_ms > 5000


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_the_path_benchmark_decides_as_the_worker_does(algorithm: Algorithm) -> None:
    from benchmarks.path import STAGES, path_round, peer_round
    from benchmarks.workload import Keys, for_topic, lives
    from processor.kafka.topics import TopicNames

    keys = Keys.generate(algorithm)
    keyring = keys.keyring.model_copy(update={"signature_max_age_ms": 10**15})
    topics = TopicNames.with_prefix("path.")
    records = for_topic(lives(keys, 30, 300, 8), keys, topics.proposals)
    assert all(dict(r.headers)["runstate-key-id"] for r in records)
    spent, commits = path_round(records, keyring, topics)
    assert set(spent) == set(STAGES) and all(s > 0 for s in spent.values())
    # The lives refuse about a tenth of their proposals; the rest commit.
    assert len(records) * 0.6 < commits < len(records)
    assert peer_round(records, keyring, topics) > 0
