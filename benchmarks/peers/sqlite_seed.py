"""A reference design fed from the topic: a state machine persisted in SQLite.

Each proposal is decided by the same `decide_record` as runstate; the run's snapshot is
loaded from SQLite, and each transition is persisted the way the design's
`StatePersistence` (below) does it: one INSERT into `state_transitions` and one INSERT OR
REPLACE into `task_checkpoints`, each committed on its own (WAL mode, Python's default
synchronous setting). Outcomes go to the same topics; the producer is idempotent, not
transactional, and input offsets are committed after the outcomes are delivered (at
least once, as that design gives)."""

import json
import sqlite3
import time

from benchmarks.peers.common import (
    keyring,
    peer_args,
    peer_consumer,
    peer_producer,
    stop_on_sigterm,
    topics,
)
from processor.engine import Commit
from processor.machines import builtin_machines
from processor.records.outputs import Source, outcome_records
from processor.records.pipeline import decide_record
from schemas.messages import RunSnapshot

SCHEMA = """
CREATE TABLE IF NOT EXISTS task_checkpoints (
    task_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    retry_count INTEGER DEFAULT 0,
    checkpoint_data TEXT DEFAULT '{}',
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS state_transitions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    event TEXT NOT NULL,
    timestamp TEXT NOT NULL,
    metadata TEXT DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS idx_transitions_task ON state_transitions(task_id, timestamp);
"""
COMMIT_INTERVAL_S = 1.0


class StatePersistence:
    """The reference design's persistence, with the snapshot as the checkpoint data."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.executescript(SCHEMA)
        self.conn.commit()

    def load(self, run_id: str) -> RunSnapshot | None:
        row = self.conn.execute(
            "SELECT checkpoint_data FROM task_checkpoints WHERE task_id = ?", (run_id,)
        ).fetchone()
        return None if row is None else RunSnapshot.model_validate_json(row[0])

    def save(self, commit: Commit, snapshot_json: bytes) -> None:
        t, s = commit.transition, commit.snapshot
        self.conn.execute(
            "INSERT INTO state_transitions (task_id, from_state, to_state, event, timestamp,"
            " metadata) VALUES (?, ?, ?, ?, ?, ?)",
            (
                t.run_id,
                t.from_state or "",
                t.to_state,
                t.event,
                str(t.at_ms),
                json.dumps(t.metadata),
            ),
        )
        self.conn.commit()
        self.conn.execute(
            "INSERT OR REPLACE INTO task_checkpoints (task_id, state, retry_count,"
            " checkpoint_data, updated_at) VALUES (?, ?, ?, ?, ?)",
            (s.run_id, s.state, s.retry_count, snapshot_json.decode(), str(t.at_ms)),
        )
        self.conn.commit()


def main() -> None:
    args = peer_args(__doc__.splitlines()[0])
    names, ring, machines = topics(args), keyring(args), builtin_machines()
    args.state_dir.mkdir(parents=True, exist_ok=True)
    db = StatePersistence(str(args.state_dir / "agent_state.db"))
    consumer = peer_consumer(args)
    producer = peer_producer(args, enable_idempotence=True)
    consumer.subscribe([names.proposals])
    stop = stop_on_sigterm()
    committed = time.monotonic()
    while not stop.is_set():
        for msg in consumer.consume(500, 0.05):
            if msg.error():
                continue
            partition, timestamp = msg.partition() or 0, msg.timestamp()[1]
            outcome = decide_record(
                msg.key(),
                msg.value(),
                msg.headers(),
                timestamp,
                topic=msg.topic() or names.proposals,
                keyring=ring,
                machines=machines,
                lookup=db.load,
                # The snapshot's window only (no lifetime lookup), and no partition check:
                # less work than the worker does.
                seen=lambda _run, _proposal: None,
                placement=None,
            )
            source = Source(
                msg.topic() or "", partition, msg.offset() or 0, msg.key(), msg.value(), timestamp
            )
            records = outcome_records(names, outcome, source)
            for record in records:
                if record.topic != names.changelog:
                    producer.produce(record.topic, record.value, record.key, partition=partition)
            if isinstance(outcome, Commit):  # its new snapshot is its last record
                db.save(outcome, records[-1].value or b"")
            producer.poll(0)
        if time.monotonic() - committed >= COMMIT_INTERVAL_S:
            producer.flush(30)
            consumer.commit(asynchronous=False)
            committed = time.monotonic()
    producer.flush(30)
    consumer.close()


if __name__ == "__main__":
    main()
