"""The ceiling: consume -> produce passthrough inside transactions, no state, no rules.

The same client settings and checkpoint cadence as the native worker (a transaction
committed as soon as a turn of the loop finds no more input, at the latest per 100 ms or
1,000 records, offsets sent with it; a turn waits up to 20 ms for its first record, then
takes what else has come), so what separates the two is the work the worker does per
proposal. (The worker also decides the next batch while a commit travels; a passthrough
has nothing to do meanwhile.)"""

import time

from confluent_kafka import TopicPartition

from benchmarks.peers.common import peer_args, peer_consumer, peer_producer, stop_on_sigterm, topics

INTERVAL_S, MAX_RECORDS = 0.1, 1_000
BATCH, WAIT_S = 500, 0.02


def main() -> None:
    args = peer_args(__doc__.splitlines()[0])
    names = topics(args)
    consumer = peer_consumer(args)
    producer = peer_producer(args, transactional_id=f"{args.group}-ceiling")
    producer.init_transactions(30)
    consumer.subscribe([names.proposals])
    stop = stop_on_sigterm()
    positions: dict[int, int] = {}
    pending, started = 0, time.monotonic()
    while not stop.is_set():
        batch = consumer.consume(1, WAIT_S)
        if batch:
            batch.extend(consumer.consume(BATCH - 1, 0))
        for msg in batch:
            if msg.error():
                continue
            if not positions:
                producer.begin_transaction()
                started = time.monotonic()
            partition = msg.partition() or 0
            producer.produce(names.transitions, msg.value(), msg.key(), partition=partition)
            positions[partition] = (msg.offset() or 0) + 1
            pending += 1
        idle = len(batch) < BATCH
        if positions and (
            idle or pending >= MAX_RECORDS or time.monotonic() - started >= INTERVAL_S
        ):
            offsets = [TopicPartition(names.proposals, p, o) for p, o in positions.items()]
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata())
            producer.commit_transaction()
            positions.clear()
            pending = 0
        producer.poll(0)
    if positions:
        producer.abort_transaction()
    consumer.close()


if __name__ == "__main__":
    main()
