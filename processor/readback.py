"""Read topics back from offset 0 to their current end (read_committed by default).

Used where the published record is the truth: the demo's accounting, tests, replay.
"""

import time
import uuid

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from processor.config import KafkaSettings


def read_topics(
    settings: KafkaSettings,
    topics: list[str],
    *,
    committed: bool = True,
    timeout: float = 120.0,
) -> list[Message]:
    """Every record of `topics` up to the end, in partition order per partition."""
    consumer = Consumer(
        settings.client(
            {
                "group.id": f"runstate-reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed" if committed else "read_uncommitted",
            }
        )
    )
    try:
        assignment = []
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=30).topics[topic]
            for p in meta.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
                if high > low:
                    assignment.append(TopicPartition(topic, p, low))
        if not assignment:
            return []
        consumer.assign(assignment)
        remaining = {(tp.topic, tp.partition) for tp in assignment}
        out: list[Message] = []
        deadline = time.monotonic() + timeout
        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {sorted(remaining)} to the end")
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                err = msg.error()
                if err is None:
                    out.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    remaining.discard((msg.topic() or "", msg.partition() or 0))
        return out
    finally:
        consumer.close()
