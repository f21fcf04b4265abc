"""What a topic and the producer take: the largest record and the largest batch, and the
framing around what a record holds.

The producer's `batch.size` is kept to the smallest batch a topic it writes takes
(`RecordLimits.batch_size`), so that no batch of several records is refused.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

#: librdkafka's default `message.max.bytes`: the largest record a producer sends.
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
#: librdkafka's default `batch.size`: how many bytes of records it packs into one batch.
DEFAULT_BATCH_SIZE = 1_000_000
#: Room kept in a record for its headers and the record and batch framing.
RECORD_OVERHEAD = 1024
#: A record batch's bytes around its records (the v2 header is 61 bytes; the broker checks
#: the whole batch against `max.message.bytes`), rounded up.
BATCH_FRAMING = 128
#: A record's bytes around its key, value and headers, at most: its length, attributes,
#: timestamp and offset deltas, and the key, value and header-count lengths (varints).
RECORD_FRAMING = 40
#: A header's bytes around its name and value, at most (two varint lengths).
HEADER_FRAMING = 10


@dataclass(frozen=True)
class RecordLimits:
    """The largest record value, key included, each output topic takes: the topic's
    `max.message.bytes` or the producer's `message.max.bytes`, whichever is smaller,
    less `RECORD_OVERHEAD`; and the most bytes of records, framing included, one batch of
    it holds (`batches`: that smaller limit less `BATCH_FRAMING`). Topics not named take
    the producer's default."""

    by_topic: Mapping[str, int] = field(default_factory=dict)
    default: int = DEFAULT_MESSAGE_MAX_BYTES - RECORD_OVERHEAD
    batches: Mapping[str, int] = field(default_factory=dict)
    default_batch: int = DEFAULT_MESSAGE_MAX_BYTES - BATCH_FRAMING

    def of(self, topic: str) -> int:
        return self.by_topic.get(topic, self.default)

    def batch(self, topic: str) -> int:
        """The bytes of records (`record_bytes`) one batch of `topic` holds at most."""
        return self.batches.get(topic, self.default_batch)

    def batch_size(self, configured: int = DEFAULT_BATCH_SIZE) -> int:
        """The producer's `batch.size`: the `configured` one, or less when a topic it
        writes takes smaller batches. The broker checks a whole batch against the topic's
        `max.message.bytes`, and a producer packs one partition's records into one batch
        up to `batch.size` (one record larger than that goes alone, and `of` bounds it)."""
        return max(1, min(configured, self.default_batch, *self.batches.values()))

    @classmethod
    def learn(cls, topics: Mapping[str, int], producer_max: int) -> "RecordLimits":
        """From each topic's `max.message.bytes` and the producer's `message.max.bytes`."""
        return cls(
            {topic: min(size, producer_max) - RECORD_OVERHEAD for topic, size in topics.items()},
            producer_max - RECORD_OVERHEAD,
            {topic: min(size, producer_max) - BATCH_FRAMING for topic, size in topics.items()},
            producer_max - BATCH_FRAMING,
        )


UNLIMITED = RecordLimits()
