"""Which partition a run lives in: Kafka's default (Java) partitioner, murmur2.

Every producer of a run's proposals must pick the same partition, or the run's state
would split. The SDK configures librdkafka's `murmur2_random`, which is the Java
client's default for keyed records; producers in other languages must do the same.
The worker uses this function to find the partition (and so the store) of a run.
"""

from functools import lru_cache

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as unsigned 32 bits."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    for i in range(0, length - length % 4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length & ~3
    rest = length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


# Every proposal is checked, and runs repeat: a hit costs 0.13 us, murmur2 2-6 us. Sized
# for the runs a worker has under way, not all it has seen: an entry holds about 230
# bytes with its run id, and 65,536 of them (the size before) filled over the first 24
# minutes of a worker fed 45 new runs a second: 15 MB that looked like a leak.
@lru_cache(maxsize=4_096)
def partition_for(run_id: str, partitions: int) -> int:
    return (murmur2(run_id.encode()) & 0x7FFFFFFF) % partitions


#: What a producer must set when it does not use this partitioner already.
PARTITIONER_ADVICE = (
    "producers must choose partitions as Kafka's Java client does, murmur2 of the key "
    "(librdkafka clients, the default in Go, .NET, JavaScript, C: set "
    "partitioner=murmur2_random)"
)
