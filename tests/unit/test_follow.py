"""`follow` (`runstate tail`): a topic's committed records from its end or its start, a
limit, a topic the broker lacks, and the consumer always closed."""

from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from confluent_kafka import TopicPartition

from processor.cli.main import cli
from processor.kafka import readback
from processor.kafka.config import KafkaSettings
from processor.kafka.readback import TopicUnavailable, follow

pytestmark = pytest.mark.unit


class _Msg:
    def __init__(self, value: bytes | None, error: object = None) -> None:
        self._value, self._error = value, error

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> object:
        return self._error


class _FakeConsumer:
    """Two partitions with offsets 0..3 each (low 1 after retention on partition 1);
    `polled` is what poll() hands out, in order, then None."""

    polled: ClassVar[list[_Msg | None]] = []
    missing: ClassVar[bool] = False
    made: ClassVar[list["_FakeConsumer"]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.assigned: list[TopicPartition] = []
        self.closed = False
        self.queue = list(self.polled)
        self.made.append(self)

    def list_topics(self, topic: str, timeout: float) -> Any:
        error = "UNKNOWN_TOPIC_OR_PART" if self.missing else None
        return SimpleNamespace(
            topics={topic: SimpleNamespace(partitions={0: 0, 1: 1}, error=error)}
        )

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return tp.partition, 4

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = tps

    def poll(self, timeout: float) -> _Msg | None:
        return self.queue.pop(0) if self.queue else None

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> type[_FakeConsumer]:
    monkeypatch.setattr(readback, "Consumer", _FakeConsumer)
    monkeypatch.setattr(_FakeConsumer, "made", [])
    monkeypatch.setattr(_FakeConsumer, "missing", False)
    monkeypatch.setattr(
        _FakeConsumer, "polled", [_Msg(b"a"), None, _Msg(None, error="x"), _Msg(b"b"), _Msg(None)]
    )
    return _FakeConsumer


def test_from_the_end_or_the_start_up_to_a_limit(consumer: type[_FakeConsumer]) -> None:
    settings = KafkaSettings.resolve("localhost:9092")
    with follow(settings, "t", limit=2) as follower:
        assert list(follower) == [b"a", b"b"]  # nothing polled, an error: skipped
    (used,) = consumer.made
    assert [(tp.partition, tp.offset) for tp in used.assigned] == [(0, 4), (1, 4)]
    assert used.config["isolation.level"] == "read_committed" and used.closed
    assert used.config["enable.auto.commit"] is False

    with follow(settings, "t", from_beginning=True, limit=3) as follower:
        assert list(follower) == [b"a", b"b", b""]  # a record without a value: empty
    assert [(tp.partition, tp.offset) for tp in consumer.made[1].assigned] == [(0, 0), (1, 1)]


def test_a_topic_the_broker_lacks(consumer: type[_FakeConsumer]) -> None:
    consumer.missing = True
    with pytest.raises(TopicUnavailable, match=r"^t: UNKNOWN_TOPIC_OR_PART$"):
        follow(KafkaSettings.resolve("localhost:9092"), "t")
    assert consumer.made[0].closed


def test_runstate_tail_prints_each_value_on_a_line(
    consumer: type[_FakeConsumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("processor.cli.options.reach", lambda settings, within_s: None)
    args = ["tail", "rejections", "--limit", "2", "--bootstrap-servers", "localhost:9092"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert result.output == "a\nb\n"
    assert consumer.made[0].assigned[0].topic == "runstate.rejections"
    consumer.missing = True
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert "runstate.rejections: UNKNOWN_TOPIC_OR_PART; run `runstate topics create`?" in (
        result.output
    )
