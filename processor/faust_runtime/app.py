"""The same engine as a faust-streaming app: a Faust agent decides each proposal and
keeps snapshots in a Faust Table on the rocksdict driver, changelogged to the same
`runs-changelog` topic; outcomes go to the same topics in the same formats.

Faust writes a table through to RocksDB and its changelog as soon as it is assigned,
before any offset is committed, so it cannot give the native worker's exactly-once.
What it gives instead (README, Guarantees per runtime), by one ordering rule: a
commit's transition, then its changelog record, are delivered (acknowledged by the
broker) before the table's store is written and before the next proposal is decided,
so before Faust can commit the offset. Then a crash can only cause
  - the same proposal decided again from the same snapshot: the same transition again,
    byte for byte, with the same transition_id (duplicates are recognisable); or
  - a proposal whose commit reached the table decided again: refused `duplicate`,
    naming its transition; the state never moves twice for one proposal id.
No outcome is lost. The Faust runtime keeps no deadlines or alerts.
"""

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import faust
from faust.web import Request, Response, View

from processor.engine import Commit
from processor.partitioning import partition_for
from processor.pipeline import DeadLetterReason, Outcome, decide_record
from processor.runtime.outputs import dead_letter_value
from processor.runtime.worker import WorkerConfig
from schemas.messages import RunSnapshot

log = logging.getLogger("runstate.faust")


@dataclass
class FaustStats:
    proposals: int = 0
    transitions: int = 0
    rejections: int = 0
    dead_letters: int = 0
    started_at: float = field(default_factory=time.time)


def build_app(config: WorkerConfig, partitions: int, http_port: int) -> faust.App:
    topics = config.topics
    datadir = Path(config.state_dir) / config.group_id / "faust"
    datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        config.group_id,
        broker=[f"kafka://{b}" for b in config.kafka.bootstrap_servers.split(",")],
        broker_credentials=None,
        store="rocksdb://",
        processing_guarantee="at_least_once",
        datadir=str(datadir),
        topic_partitions=partitions,
        topic_disable_leader=True,
        topic_allow_declare=False,  # runstate's topics exist (runstate topics create)
        consumer_auto_offset_reset="earliest",
        # Faust commits offsets on a timer; below about a second it overlaps itself.
        broker_commit_interval=max(1.0, config.commit_interval_ms / 1000),
        # The native worker's failover time (Faust's default is 60 s).
        broker_session_timeout=10.0,
        broker_heartbeat_interval=2.0,
        web_enabled=True,
        web_bind=config.http_host,
        web_port=http_port,
        web_in_thread=False,
        key_serializer="raw",
        value_serializer="raw",
    )
    # Raw bytes everywhere (app-wide serializers): the same wire format as the native worker.
    proposals = app.topic(topics.proposals)
    transitions = app.topic(topics.transitions)
    rejections = app.topic(topics.rejections)
    dlq = app.topic(topics.dlq)
    changelog = app.topic(topics.changelog, partitions=partitions)
    runs = app.Table(
        "runs",
        default=None,
        partitions=partitions,
        changelog_topic=changelog,
        key_type=bytes,
        value_type=bytes,
        options={"driver": "rocksdict"},
    )
    stats = FaustStats()

    def snapshot_of(run_id: str) -> RunSnapshot | None:
        raw_value = runs.get(run_id.encode())
        return None if raw_value is None else RunSnapshot.model_validate_json(raw_value)

    @app.agent(proposals, name="decide")
    async def decide_proposals(stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            at_ms = round(message.timestamp * 1000)
            outcome: Outcome
            try:
                outcome = decide_record(
                    message.key,
                    message.value,
                    message.headers,
                    at_ms,
                    keyring=config.keyring,
                    machines=config.machines,
                    lookup=snapshot_of,
                    max_bytes=config.max_proposal_bytes,
                )
            except Exception as exc:  # a bug must not stall the partition
                log.exception("deciding %s@%s failed", message.partition, message.offset)
                outcome = DeadLetterReason(f"internal error while deciding: {exc!r}")
            partition = message.partition
            if isinstance(outcome, Commit):
                key = outcome.snapshot.run_id.encode()
                # Delivered first: a table write never runs ahead of its transition.
                sent = await transitions.send(
                    key=key,
                    value=outcome.transition.model_dump_json().encode(),
                    partition=partition,
                )
                await sent
                # Then the changelog record, also awaited, and only then the table's
                # store. Faust's own `runs[key] = ...` sends it whenever its buffer
                # drains, possibly after the offset is committed; a crash there lost
                # the record, and recovery replayed older ones over the newer store.
                value = outcome.snapshot.model_dump_json().encode()
                logged = await changelog.send(key=key, value=value, partition=partition)
                await logged
                runs.data[key] = value
                stats.transitions += 1
            elif isinstance(outcome, DeadLetterReason):
                value = dead_letter_value(
                    message.topic,
                    partition,
                    message.offset,
                    message.key,
                    message.value,
                    outcome.reason,
                    at_ms,
                )
                await (await dlq.send(key=message.key, value=value, partition=partition))
                stats.dead_letters += 1
            else:
                key = outcome.run_id.encode() if outcome.run_id is not None else message.key
                # Delivered before the offset can be committed, like every outcome.
                await (
                    await rejections.send(
                        key=key, value=outcome.model_dump_json().encode(), partition=partition
                    )
                )
                stats.rejections += 1
            stats.proposals += 1

    def owned() -> list[int]:
        return sorted(
            tp.partition for tp in app.assignor.assigned_actives() if tp.topic == topics.proposals
        )

    @app.page("/health")
    class Health(View):
        async def get(self, request: Request) -> Response:
            return self.json(
                {
                    "status": "ok",
                    "runtime": "faust",
                    "group_id": config.group_id,
                    "partitions": owned() if app.rebalancing is False else [],
                    "stats": asdict(stats),
                }
            )

    @app.page("/runs/{run_id}")
    class Run(View):
        async def get(self, request: Request, run_id: str) -> Response:
            partition = partition_for(run_id, partitions)
            if partition not in owned():
                return self.json(
                    {
                        "error": f"run '{run_id}' lives in partition {partition}",
                        "partition": partition,
                    },
                    status=421,
                )
            snapshot = snapshot_of(run_id)
            if snapshot is None:
                return self.json({"error": f"no run '{run_id}'"}, status=404)
            return self.json(snapshot.model_dump(mode="json"))

    @app.page("/runs/{run_id}/history")
    class History(View):
        async def get(self, request: Request, run_id: str) -> Response:
            return self.json(
                {"error": "the faust runtime keeps no history; use `runstate get --at` or tail"},
                status=501,
            )

    return app
