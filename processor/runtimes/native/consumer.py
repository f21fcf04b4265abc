"""The native worker's consumer of the proposals topic: read_committed, offsets committed
only inside its transactions, and the rebalancing protocol its membership calls for."""

from confluent_kafka import Consumer

from processor.runtimes.settings import WorkerConfig
from processor.serving.peers import client_id

# Proposal bytes librdkafka may prefetch ahead of the loop (its default: 64 MB). Under a
# backlog it fetched that much, and its fetch thread's malloc arena kept the 64 MB
# after the backlog was drained (of 114 MB freed but kept by a worker that had taken
# 1,000,000 runs). 8 MB is still some 30,000 of the benchmark's proposals, seconds of work.
CONSUME_QUEUE_KBYTES = 8 * 1024


def proposals_consumer(
    config: WorkerConfig, worker_id: str, advertised_url: str | None
) -> Consumer:
    """The consumer, not yet subscribed. `advertised_url` goes into its client.id, where
    other workers find this one's HTTP API; a static member is known by its worker id."""
    return Consumer(
        config.kafka.client(
            {
                "group.id": config.settings.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "partition.assignment.strategy": assignment_strategy(
                    config.settings.static_membership
                ),
                "enable.partition.eof": False,
                **({"client.id": client_id(advertised_url)} if advertised_url else {}),
                **(
                    {"group.instance.id": f"{config.settings.group_id}-{worker_id}"}
                    if config.settings.static_membership
                    else {}
                ),
            },
            defaults={
                # Failover after a crash takes up to this long (Kafka's default is 45 s).
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 2_000,
                "queued.max.messages.kbytes": CONSUME_QUEUE_KBYTES,
            },
        )
    )


def assignment_strategy(static_membership: bool) -> str:
    """Cooperative rebalancing moves partitions in two rounds: the owner gives them up,
    then rejoins so they can go elsewhere. A static member killed between the two is
    replaced without a rebalance (its restart rejoins a stable group), so nobody rejoins
    and the partitions it gave up stay unowned until the membership changes again (seen
    in the fault harness: two of three partitions idle for minutes). Eager rebalancing
    hands out the whole assignment in one round, so static members use it."""
    return "roundrobin" if static_membership else "cooperative-sticky"
