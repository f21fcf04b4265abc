"""Which broker serves what: a partition's leader, a consumer group's coordinator, a
transactional id's coordinator. The fault scenarios aim their kills with these."""

from confluent_kafka.admin import AdminClient

TRANSACTION_STATE = "__transaction_state"
CONSUMER_OFFSETS = "__consumer_offsets"


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, in
    32-bit two's complement."""
    units = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def kafka_abs(n: int) -> int:
    """Kafka's Utils.abs in 4.1: Math.abs, except Integer.MIN_VALUE gives 0 (Math.abs
    would give it back, negative). Not `n & 0x7fffffff` (that was 0.8's Scala Utils):
    the two differ for every other negative n."""
    return 0 if n == -(1 << 31) else abs(n)


def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of __transaction_state (key: a transactional id) or of
    __consumer_offsets (key: a group id) whose leader coordinates `key`: Kafka 4.1's
    TransactionStateManager.partitionFor and GroupCoordinatorService.partitionFor both
    compute Utils.abs(key.hashCode()) % partitions."""
    return kafka_abs(java_string_hash(key)) % partitions


def leader_of(admin: AdminClient, topic: str, partition: int, timeout: float = 10.0) -> int:
    """The node id leading `topic`'s `partition` in the metadata a broker answers with
    (-1 while it has none); raises KeyError when there is no such partition."""
    metadata = admin.list_topics(topic, timeout=timeout).topics[topic]
    if metadata.error is not None:
        raise KeyError(f"{topic}: {metadata.error.str()}")
    return int(metadata.partitions[partition].leader)


def partition_count(admin: AdminClient, topic: str, timeout: float = 10.0) -> int:
    metadata = admin.list_topics(topic, timeout=timeout).topics[topic]
    if metadata.error is not None or not metadata.partitions:
        raise KeyError(f"{topic} does not exist (yet)")
    return len(metadata.partitions)


def group_coordinator(admin: AdminClient, group_id: str, timeout: float = 10.0) -> int:
    """The node id coordinating `group_id`: the leader of its partition of
    __consumer_offsets, which exists once any group has joined or committed (KeyError
    before that). describe_consumer_groups names the coordinator too, but librdkafka
    (2.16) aborts the whole process (`eonce->refcnt > 0`, librdkafka issue 4605) some
    time after such a request timed out, and a fault harness asks exactly while
    brokers die: the metadata request has no such failure."""
    partitions = partition_count(admin, CONSUMER_OFFSETS, timeout)
    partition = coordinator_partition(group_id, partitions)
    return leader_of(admin, CONSUMER_OFFSETS, partition, timeout)


def transaction_coordinator(
    admin: AdminClient, transactional_id: str, timeout: float = 10.0
) -> int:
    """The node id coordinating `transactional_id`: the leader of its partition of
    __transaction_state. The topic exists once any producer has called
    init_transactions (KeyError before that). No client API of librdkafka's asks
    FindCoordinator for a transactional id, hence the computation."""
    partitions = partition_count(admin, TRANSACTION_STATE, timeout)
    partition = coordinator_partition(transactional_id, partitions)
    return leader_of(admin, TRANSACTION_STATE, partition, timeout)
