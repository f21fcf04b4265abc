"""The broker is real: produce, consume, transactions, topics, and the launcher's CLI."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from processor.broker.launcher import Broker, ensure_jars, jars_dir
from processor.kafka.topic_checks import describe_topics
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames
from tests.integration.harness import consume_all


def _consume_all(bootstrap: str, topic: str, expected: int, **extra: str) -> list[bytes]:
    return [m.value() or b"" for m in consume_all(bootstrap, topic, expected, **extra)]


def test_produce_and_consume(kafka_bootstrap: str, topic_names: TopicNames) -> None:
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for i in range(100):
        producer.produce(topic_names.proposals, key=f"run-{i % 7}", value=f"v{i}".encode())
    assert producer.flush(30) == 0
    got = _consume_all(kafka_bootstrap, topic_names.proposals, 100)
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(100))


def test_transactions_and_read_committed(kafka_bootstrap: str, topic_names: TopicNames) -> None:
    producer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic_names.transitions, key="r", value=f"committed-{i}".encode())
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic_names.transitions, key="r", value=f"aborted-{i}".encode())
    producer.flush(30)
    producer.abort_transaction(30)

    committed = _consume_all(
        kafka_bootstrap, topic_names.transitions, 10, **{"isolation.level": "read_committed"}
    )
    assert sorted(committed) == sorted(f"committed-{i}".encode() for i in range(10))
    uncommitted = _consume_all(
        kafka_bootstrap, topic_names.transitions, 20, **{"isolation.level": "read_uncommitted"}
    )
    assert len(uncommitted) == 20  # the aborted records are in the log, just not visible


def test_topics_create_is_idempotent_and_describe_finds_drift(admin: AdminClient) -> None:
    names = TopicNames.with_prefix(f"d-{uuid.uuid4().hex[:8]}.")
    plans = plan_topics(names, partitions=2, replication=1)
    assert set(create_topics(admin, plans).values()) == {"created"}
    assert set(create_topics(admin, plans).values()) == {"exists"}
    assert describe_topics(admin, plans) == []
    drift = describe_topics(admin, plan_topics(names, partitions=4, replication=1))
    # every topic keyed by run id follows the proposals' count; the machines topic has one
    assert {d.topic for d in drift} == {p.name for p in plans if p.role != "machines"}
    assert all(d.setting == "partitions" and d.actual == "2" for d in drift)
    missing = describe_topics(admin, plan_topics(TopicNames.with_prefix("nope."), 1, 1))
    assert {d.setting for d in missing} == {"existence"}


def test_topic_settings_on_the_broker(admin: AdminClient, topic_names: TopicNames) -> None:
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    resources = [
        ConfigResource(ConfigResource.Type.TOPIC, topic_names.proposals),
        ConfigResource(ConfigResource.Type.TOPIC, topic_names.changelog),
        ConfigResource(ConfigResource.Type.TOPIC, topic_names.transitions),
    ]
    configs = {r.name: f.result() for r, f in admin.describe_configs(resources).items()}
    assert configs[topic_names.proposals]["message.timestamp.type"].value == "LogAppendTime"
    assert configs[topic_names.changelog]["cleanup.policy"].value == "compact"
    assert configs[topic_names.transitions]["retention.ms"].value == "-1"


def test_broker_time_stamps_proposals(kafka_bootstrap: str, topic_names: TopicNames) -> None:
    """A client cannot backdate a proposal: the broker's append time replaces its claim."""
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic_names.proposals, key="r", value=b"x", timestamp=1_000)
    producer.flush(30)
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic_names.proposals])
    msg = None
    for _ in range(40):
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            break
    consumer.close()
    assert msg is not None
    kind, ts = msg.timestamp()
    assert kind == 2 and ts > 1_600_000_000_000  # TIMESTAMP_LOG_APPEND_TIME, not 1000


@pytest.mark.usefixtures("launcher")
def test_cli_broker_lifecycle_leaves_no_process(tmp_path: Path) -> None:
    """`broker start`, `topics create`, `topics describe`, `broker stop` from a shell."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("BOOTSTRAP_SERVERS")}
    env["RUNSTATE_BROKER_DIR"] = str(tmp_path / "b")
    runstate = [sys.executable, "-m", "processor.cli.main"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*runstate, *args], env=env, capture_output=True, text=True, timeout=180
        )

    started = run("broker", "start")
    assert started.returncode == 0, started.stderr
    broker = Broker.load(tmp_path / "b")
    assert broker is not None and broker.alive()
    try:
        env["RUNSTATE_BOOTSTRAP_SERVERS"] = broker.bootstrap
        created = run("topics", "create", "--partitions", "2")
        assert created.returncode == 0, created.stderr
        assert "runstate.proposals: created" in created.stdout
        described = run("topics", "describe", "--partitions", "2")
        assert described.returncode == 0 and "match the expected settings" in described.stdout
        drifted = run("topics", "describe", "--partitions", "5")
        assert drifted.returncode == 1 and "partitions is 2, expected 5" in drifted.stderr
        assert run("broker", "status").returncode == 0
    finally:
        stopped = run("broker", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not broker.alive(), "the broker's java process is still running"
    assert run("broker", "status").returncode == 1


@pytest.mark.usefixtures("launcher")
def test_second_start_reuses_cached_jars(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the jars cached, Maven is not needed at all: no download happens."""
    ensure_jars()
    marker = jars_dir() / ".complete"
    assert marker.exists()
    monkeypatch.setenv("PATH", "/nonexistent")  # no mvn (and no java) reachable
    assert ensure_jars() == jars_dir()


def test_unreachable_broker_is_a_clear_error() -> None:
    admin = AdminClient({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    with pytest.raises(KafkaException):
        create_topics(admin, plan_topics(TopicNames.with_prefix("x."), 1, 1), timeout=2)


@pytest.mark.usefixtures("launcher")
def test_broker_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A SIGKILLed test run or demo must not leave its broker running."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from processor.broker.launcher import start_broker\n"
        "start_broker(Path(sys.argv[1]))\n"
        "print('up', flush=True)\n"
        "time.sleep(300)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith("BOOTSTRAP_SERVERS")}
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "b")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert parent.stdout is not None and parent.stdout.readline().strip() == "up"
    broker = Broker.load(tmp_path / "b")
    assert broker is not None and broker.alive()
    parent.kill()
    parent.wait()
    for _ in range(100):
        if not broker.alive():
            break
        time.sleep(0.2)
    assert not broker.alive(), "the broker outlived the process that started it"
