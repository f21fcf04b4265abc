"""Finding a committed transition by id (blocking): how a retry of a committed proposal
gets the answer the first attempt got."""

from confluent_kafka import KafkaException

from processor.kafka.config import KafkaSettings
from processor.kafka.partitioning import partition_for
from processor.kafka.readback import read_partition
from processor.kafka.topics import TopicNames
from schemas.messages import Transition

from .core import Deadline, unavailable
from .errors import Unavailable
from .reader import RunReader


def committed_transition(
    reader: RunReader,
    settings: KafkaSettings,
    topics: TopicNames,
    partitions: int,
    run_id: str,
    transition_id: str,
    timeout: float,
) -> Transition | None:
    """From a worker's API when given worker URLs (one request), else from the run's
    partition of the transitions topic (kept forever by default, so found however long
    ago it was committed)."""
    deadline = Deadline(timeout)
    try:
        return next(
            t
            for t in reader.history(run_id, timeout=max(0.1, deadline.left()))
            if t.transition_id == transition_id
        )
    except (ValueError, LookupError, Unavailable, StopIteration):
        pass
    key = run_id.encode()
    try:
        for record in read_partition(
            settings,
            topics.transitions,
            partition_for(run_id, partitions),
            timeout=max(1.0, deadline.left()),
        ):
            if record.key == key and record.value is not None:
                found = Transition.model_validate_json(record.value)
                if found.transition_id == transition_id:
                    return found
    except KafkaException as exc:
        raise unavailable(settings, "reading the transitions topic", timeout, exc) from exc
    return None
