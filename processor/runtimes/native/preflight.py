"""Before a native worker joins its group: do the topics fit it? Learns how many
partitions the proposals topic has and how large a record, and a batch of records, each
output topic takes, and refuses (WorkerError) topics that would make it fail later,
mid-stream. `learn_limits` is what either runtime reads again when the broker refuses a
record for its size."""

from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from processor.kafka.config import KafkaSettings
from processor.kafka.topic_checks import describe_topics, max_message_bytes
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames
from processor.records.changelog_keys import FIRED_CHANGELOG_PREFIX
from processor.records.limits import DEFAULT_MESSAGE_MAX_BYTES, RECORD_OVERHEAD, RecordLimits
from processor.runtimes.errors import WorkerError
from processor.runtimes.settings import WorkerConfig
from schemas.identifiers import MAX_RUN_ID_BYTES


@dataclass(frozen=True)
class Topics:
    partitions: int  # of the proposals topic, and of every other (co-partitioned)
    limits: RecordLimits  # what each output topic takes


def check_topics(config: WorkerConfig) -> Topics:
    admin = AdminClient(config.kafka.client())
    try:
        metadata = admin.list_topics(timeout=30)
    except KafkaException as exc:
        raise WorkerError(f"cannot reach Kafka at {config.kafka.bootstrap_servers}: {exc}") from exc
    topics = config.topics
    proposals = metadata.topics.get(topics.proposals)
    if proposals is None or proposals.error is not None:
        raise WorkerError(f"topic {topics.proposals} does not exist; run `runstate topics create`")
    partitions = len(proposals.partitions)
    plans = plan_topics(topics, partitions, 1)
    # Co-partitioning matters (outputs go to the proposal's partition number), and so
    # do broker timestamps (the time of each decision); replication and retention
    # are the operator's business, so not checked here.
    drift = [
        d
        for d in describe_topics(admin, plans)
        if d.setting in ("existence", "partitions", "cleanup.policy", "message.timestamp.type")
    ]
    if drift:
        raise WorkerError(
            "topics do not fit the worker: "
            + "; ".join(str(d) for d in drift)
            + ". Fix with `runstate topics create` (a missing topic), or change a setting in "
            "place (kafka-configs.sh --alter --entity-type topics --entity-name <topic> "
            "--add-config message.timestamp.type=LogAppendTime)."
        )
    limits = learn_limits(admin, config.kafka, topics)
    # A commit writes a snapshot and a transition of up to max_state_bytes, keyed by
    # the run id: the topics must take them, or the broker would refuse a commit.
    needed = config.settings.max_state_bytes + MAX_RUN_ID_BYTES + len(FIRED_CHANGELOG_PREFIX)
    for topic in (topics.transitions, topics.changelog):
        if limits.of(topic) < needed:
            raise WorkerError(
                f"topic {topic} takes records of up to {limits.of(topic)} bytes "
                f"(max.message.bytes, and the producer's message.max.bytes, less "
                f"{RECORD_OVERHEAD} for framing), but a commit may write "
                f"{needed} (--max-state-bytes {config.settings.max_state_bytes} plus the "
                f"key): raise max.message.bytes on {topic} or lower --max-state-bytes"
            )
    return Topics(partitions, limits)


def learn_limits(
    admin: AdminClient, kafka: KafkaSettings, topics: TopicNames, timeout: float = 30.0
) -> RecordLimits:
    """What each topic a worker writes takes (its `max.message.bytes`, and the producer's
    `message.max.bytes`): a record, and a batch of records. KafkaException when the
    configs cannot be read."""
    producer_max = int(kafka.client_config.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES))
    written = [
        topics.transitions,
        topics.rejections,
        topics.dlq,
        topics.changelog,
        topics.alerts,
        topics.heartbeats,
        topics.proposals,  # deadlines that fell due
    ]
    return RecordLimits.learn(max_message_bytes(admin, written, timeout), producer_max)


def batch_size(kafka: KafkaSettings, limits: RecordLimits, default: int) -> int:
    """The producer's `batch.size`: the one configured (`-X batch.size`; else the client's
    `default`), or less when a topic it writes takes smaller batches."""
    return limits.batch_size(int(kafka.client_config.get("batch.size", default)))
