"""Which topics a state directory reflects: the cluster's id, the ids of the topics its
stores were restored from, and the proposals topic's partition count, kept beside the
stores and compared at every start.

- Topics deleted and created again under the same names (a compose file that keeps the
  worker's state volume but not Kafka's data) have new ids: the stores describe data
  that no longer exists, so they are discarded and restored from the new topics. Only
  comparing offsets would not see it: a store whose offset is at or past the new
  topic's end would be trusted as it is.
- A changed partition count moves runs between partitions (murmur2 of the key modulo
  the count): a run's proposals would be decided against a partition that does not
  hold its state. The worker refuses to start; see `PARTITION_COUNT_CHANGED`.
"""

import json
import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from processor.kafka.topics import TopicNames
from processor.runtimes.errors import WorkerError

log = logging.getLogger("runstate.identity")
FILE = "identity.json"

PARTITION_COUNT_CHANGED = (
    "A run lives in partition murmur2(run id) mod the count, so a new count moves most "
    "runs away from their state (and Kafka cannot take partitions away again). Either go "
    "back to topics with the old count (`runstate topics create --topic-prefix NEW. "
    "--partitions OLD`, then point workers and agents at them), or let the runs in "
    "flight finish and start the new count on new topics with an empty --state-dir."
)


@dataclass(frozen=True)
class Identity:
    cluster_id: str
    topic_ids: dict[str, str]  # topic name -> topic id
    partitions: int

    def same_data(self, other: "Identity") -> bool:
        return self.cluster_id == other.cluster_id and self.topic_ids == other.topic_ids


def current(admin: AdminClient, topics: TopicNames, partitions: int) -> Identity:
    """The identity of the cluster's topics a worker reads and restores from now."""
    names = [topics.proposals, topics.changelog, topics.transitions]
    try:
        cluster_id = admin.describe_cluster(request_timeout=30).result().cluster_id
        described = admin.describe_topics(TopicCollection(names), request_timeout=30)
        ids = {name: str(future.result().topic_id) for name, future in described.items()}
    except KafkaException as exc:
        raise WorkerError(f"cannot describe the cluster and its topics: {exc}") from exc
    return Identity(str(cluster_id), dict(sorted(ids.items())), partitions)


def reconcile(root: Path, now: Identity, discard: list[Path]) -> bool:
    """Compare the identity kept in `root` with `now`. Returns True when the state was
    written from other topics and `discard` (the stores) were removed; raises WorkerError
    when the partition count changed. The identity `now` is kept for the next start."""
    path = root / FILE
    kept = _read(path)
    discarded = False
    if kept is not None and kept.partitions != now.partitions:
        raise WorkerError(
            f"the proposals topic has {now.partitions} partitions, but the state in {root} "
            f"was built with {kept.partitions}. {PARTITION_COUNT_CHANGED}"
        )
    if kept is not None and not kept.same_data(now):
        log.warning(
            "the topics in %s are not those this state was restored from (cluster %s, "
            "topics %s; now cluster %s, topics %s): discarding the stores, restoring from "
            "the topics",
            root,
            kept.cluster_id,
            kept.topic_ids,
            now.cluster_id,
            now.topic_ids,
        )
        for store in discard:
            _remove(store)
        discarded = True
    if kept != now:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(now), indent=2))
        tmp.replace(path)
    return discarded


def _read(path: Path) -> Identity | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return Identity(str(data["cluster_id"]), dict(data["topic_ids"]), int(data["partitions"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise WorkerError(
            f"{path} is not readable ({exc!r}); delete it (the stores are then kept) or "
            "the whole state directory (rebuilt from the topics)"
        ) from exc


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
