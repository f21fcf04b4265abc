"""The local three-node cluster is real: topics with three replicas and min.insync.replicas
2, transactions and where their coordinator is, a killed leader replaced while acks=all
producers go on, and a node whose data is lost catching up from the others."""

import json
import time
import uuid
from collections.abc import Iterable

from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    NewTopic,
)

from processor.broker.cluster import Cluster
from processor.broker.coordinators import (
    TRANSACTION_STATE,
    coordinator_partition,
    java_string_hash,
)
from processor.broker.jars import ensure_tools
from processor.broker.quorum import Quorum
from processor.broker.server import Jvm, run_tool
from processor.cli.main import cli
from processor.kafka.topic_checks import topic_configs
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import TopicPlan
from processor.kafka.topics import TopicNames
from tests.integration.harness import consume_all


def _topic(cluster: Cluster, partitions: int = 3) -> str:
    """A topic as production has them: three replicas, min.insync.replicas 2."""
    name = f"c-{uuid.uuid4().hex[:10]}"
    create_topics(
        cluster.admin, [TopicPlan(name, "test", partitions, 3, {"min.insync.replicas": "2"})]
    )
    cluster.wait_in_sync(timeout=30)  # and every replica there
    return name


def _configs(cluster: Cluster, topics: Iterable[str]) -> dict[str, dict[str, str]]:
    found = topic_configs(cluster.admin, list(topics), timeout=30)
    return {name: {k: e.value for k, e in config.items()} for name, config in found.items()}


def _replicas(cluster: Cluster, topic: str) -> set[int]:
    """The replica counts of the topic's partitions, once the broker asked knows it (a
    node learns of a new topic on its own, a moment after the controller made it)."""
    deadline = time.monotonic() + 10
    while True:
        metadata = cluster.admin.list_topics(topic, timeout=10).topics[topic]
        if (metadata.error is None and metadata.partitions) or time.monotonic() > deadline:
            return {len(p.replicas) for p in metadata.partitions.values()}
        time.sleep(0.1)


def _produce(producer: Producer, topic: str, values: Iterable[str], partition: int = -1) -> None:
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, _: Message) -> None:
        if err is not None:
            failed.append(err)

    for value in values:
        producer.produce(topic, value=value.encode(), partition=partition, on_delivery=delivered)
    assert producer.flush(60) == 0, "records still undelivered after 60 s"
    assert failed == []


def test_topics_and_internal_topics_get_three_replicas_and_min_isr_two(
    kafka_cluster: Cluster,
) -> None:
    prefix = f"c-{uuid.uuid4().hex[:8]}."
    env = {"RUNSTATE_BOOTSTRAP_SERVERS": kafka_cluster.bootstrap, "RUNSTATE_TOPIC_PREFIX": prefix}
    created = CliRunner().invoke(cli, ["topics", "create", "--partitions", "2", "--json"], env=env)
    assert created.exit_code == 0, created.output
    summary = json.loads(created.stdout)
    assert (summary["replication_factor"], summary["replication_from"], summary["brokers"]) == (
        3,
        "cluster",
        3,
    )
    names = [t["name"] for t in summary["topics"]]
    assert names == [getattr(TopicNames.with_prefix(prefix), t["role"]) for t in summary["topics"]]
    assert all(_replicas(kafka_cluster, name) == {3} for name in names)
    assert {c["min.insync.replicas"] for c in _configs(kafka_cluster, names).values()} == {"2"}

    # The internal topics, and a topic created without settings, follow the cluster too;
    # and the group's coordinator is where the cluster says it is.
    group = f"g-{uuid.uuid4().hex}"
    _join(kafka_cluster, group, names[0])  # makes __consumer_offsets
    fresh = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})  # see group_coordinator
    described = fresh.describe_consumer_groups([group], request_timeout=60)[group].result()
    assert kafka_cluster.group_coordinator(group) == described.coordinator.id
    producer = Producer(
        {"bootstrap.servers": kafka_cluster.bootstrap, "transactional.id": uuid.uuid4().hex}
    )
    producer.init_transactions(30)  # makes __transaction_state
    bare = f"c-bare-{uuid.uuid4().hex[:8]}"
    for future in kafka_cluster.admin.create_topics([NewTopic(bare, 1)]).values():
        future.result()
    internal = ["__consumer_offsets", TRANSACTION_STATE, bare]
    for name in internal:
        assert _replicas(kafka_cluster, name) == {3}, name
    configs = _configs(kafka_cluster, internal)
    assert {configs[name]["min.insync.replicas"] for name in internal} == {"2"}

    status = CliRunner().invoke(
        cli, ["broker", "status", "--json"], env={"RUNSTATE_BROKER_DIR": kafka_cluster.data_dir}
    )
    assert status.exit_code == 0, status.output
    reported = json.loads(status.stdout)
    assert reported["running"] and reported["bootstrap"] == kafka_cluster.bootstrap
    assert [(n["id"], n["pid"], n["alive"]) for n in reported["nodes"]] == [
        (node.node_id, node.pid, True) for node in kafka_cluster.nodes
    ]


def test_transactions_and_where_their_coordinator_is(kafka_cluster: Cluster) -> None:
    topic = _topic(kafka_cluster)
    # An id whose partition tells Kafka's Utils.abs from a `& 0x7fffffff` mask.
    while True:
        tid = f"tx-{uuid.uuid4().hex}"
        if coordinator_partition(tid, 3) != (java_string_hash(tid) & 0x7FFFFFFF) % 3:
            break
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "transactional.id": tid})
    producer.init_transactions(30)
    producer.begin_transaction()
    _produce(producer, topic, (f"committed-{i}" for i in range(10)))
    producer.commit_transaction(30)
    producer.begin_transaction()
    _produce(producer, topic, (f"aborted-{i}" for i in range(5)))
    producer.abort_transaction(30)
    committed = consume_all(
        kafka_cluster.bootstrap, topic, 10, **{"isolation.level": "read_committed"}
    )
    assert sorted(m.value() for m in committed) == sorted(
        f"committed-{i}".encode() for i in range(10)
    )

    # The partition of __transaction_state Kafka wrote the id's state to is the one
    # computed, and the coordinator the broker reports is that partition's leader.
    assert _state_partition(kafka_cluster, tid) == coordinator_partition(tid, 3)
    described = run_tool(
        Jvm.find(),
        "org.apache.kafka.tools.TransactionsCommand",
        "--bootstrap-server",
        kafka_cluster.bootstrap,
        "describe",
        "--transactional-id",
        tid,
        tools=ensure_tools(),
    )
    assert described.returncode == 0, described.stderr
    header, row = (line.split() for line in described.stdout.strip().splitlines()[:2])
    reported = dict(zip(header, row, strict=False))
    assert reported["TransactionalId"] == tid
    assert int(reported["CoordinatorId"]) == kafka_cluster.transaction_coordinator(tid)


def _join(cluster: Cluster, group: str, topic: str) -> None:
    """A consumer of `group` joins it (gets its assignment) and leaves."""
    joined: list[object] = []
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    consumer.subscribe([topic], on_assign=lambda _, assigned: joined.append(assigned))
    deadline = time.monotonic() + 60
    try:
        while not joined and time.monotonic() < deadline:
            consumer.poll(0.2)
    finally:
        consumer.close()
    assert joined, f"no assignment for {group} within 60 s"


def _state_partition(cluster: Cluster, transactional_id: str) -> int:
    """The partition of __transaction_state holding records keyed by the id."""
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap, "group.id": f"g-{uuid.uuid4().hex}"}
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(TRANSACTION_STATE, p), 10)[1]
            for p in range(3)
        }
        consumer.assign([TopicPartition(TRANSACTION_STATE, p, 0) for p in range(3)])
        found: set[int] = set()
        read = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + 30
        while any(read[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error() is None:
                    read[msg.partition()] = msg.offset() + 1
                    if transactional_id.encode() in (msg.key() or b""):
                        found.add(msg.partition())
    finally:
        consumer.close()
    assert len(found) == 1, found
    return found.pop()


def test_a_killed_leader_is_replaced_then_its_wiped_node_catches_up(
    kafka_cluster: Cluster,
) -> None:
    """A node dies, and with it its disk: while it is down its partitions get new
    leaders and acks=all producers go on; started again empty, it catches up from the
    others, back in every ISR and in the controller quorum, and nothing is lost."""
    topic = _topic(kafka_cluster)
    producer = Producer(
        {
            "bootstrap.servers": kafka_cluster.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "log_level": 0,  # the dead leader's connections fail by design
        }
    )
    for partition in range(3):  # keyless records would stick to one partition
        _produce(producer, topic, (f"before-{i}" for i in range(partition, 999, 3)), partition)
    node = kafka_cluster.node(kafka_cluster.leader_of(topic, 0))
    lost = (node.node_id, node.directory_id)
    killed = time.monotonic()
    kafka_cluster.kill(node.node_id)
    try:
        while kafka_cluster.leader_of(topic, 0) in (node.node_id, -1):
            assert time.monotonic() - killed < 60, f"node {node.node_id} still leads after 60 s"
            time.sleep(0.2)
        moved = time.monotonic() - killed
        _produce(producer, topic, (f"after-{i}" for i in range(1000)), partition=0)
        print(f"leadership of {topic}[0] moved {moved:.1f} s after node {node.node_id} died")

        kafka_cluster.wipe_and_start(node.node_id)
        assert kafka_cluster.out_of_sync(node.node_id) == []
        # It holds the data again, written by replication alone.
        for partition in range(3):
            segment = node.log_dir / f"{topic}-{partition}" / "00000000000000000000.log"
            assert segment.stat().st_size > 0, segment
        # And it votes again, under its new directory id only.
        voters = Quorum(Jvm.find(), ensure_tools(), kafka_cluster.bootstrap).voters()
        assert (node.node_id, node.directory_id) in voters and lost not in voters
        assert len(voters) == 3
        values = sorted(m.value() for m in consume_all(kafka_cluster.bootstrap, topic, 1999))
        expected = [f"before-{i}".encode() for i in range(999)]
        expected += [f"after-{i}".encode() for i in range(1000)]
        assert values == sorted(expected)  # none lost, none twice
    finally:
        if not node.alive():  # whatever failed, the next test gets three nodes
            kafka_cluster.start(node.node_id)
        kafka_cluster.wait_in_sync(timeout=60)
