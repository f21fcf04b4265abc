"""A Quix Streams app applying the same rules: `decide_record` over a RocksDB state store,
exactly-once.

Runs in an environment of its own (Quix Streams pins confluent-kafka < 2.13 and
pydantic < 2.14; `benchmarks.quixenv` creates it), with the project on PYTHONPATH. The
run's snapshot is the key's state (Quix keys state by the record key, the run_id);
outcomes go to the same topics in the same formats."""

from typing import Any

from quixstreams import Application, message_context
from quixstreams.models.serializers import Serializer

from benchmarks.peers.common import keyring, peer_args, topics
from processor.engine import Commit
from processor.machines import builtin_machines
from processor.records.outputs import OutputRecord, Source, outcome_records
from processor.records.pipeline import decide_record
from schemas.messages import RunSnapshot

SNAPSHOT = "snapshot"


class RecordValue(Serializer):  # type: ignore[misc]
    """Writes an OutputRecord's value as it is."""

    def __call__(self, value: Any, ctx: Any) -> bytes:
        return value.value  # type: ignore[no-any-return]


def main() -> None:
    args = peer_args(__doc__.splitlines()[0])
    names, ring, machines = topics(args), keyring(args), builtin_machines()
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=str(args.state_dir),
        # The native worker's checkpoint cadence: 100 ms or 1,000 records.
        commit_interval=0.1,
        commit_every=1_000,
        loglevel="WARNING",
    )
    proposals = app.topic(names.proposals, key_deserializer="bytes", value_deserializer="bytes")
    outputs = {
        name: app.topic(name, key_serializer="bytes", value_serializer=RecordValue())
        for name in (names.transitions, names.rejections, names.dlq)
    }

    def decide(
        value: bytes, key: bytes, timestamp: int, headers: Any, state: Any
    ) -> list[OutputRecord]:
        raw = state.get(SNAPSHOT)
        snapshot = None if raw is None else RunSnapshot.model_validate_json(raw)
        outcome = decide_record(
            key,
            value,
            headers or [],
            timestamp,
            topic=names.proposals,
            keyring=ring,
            machines=machines,
            lookup=lambda _run_id: snapshot,
            # The snapshot's window only (no lifetime lookup), and no partition check:
            # less work than the worker does.
            seen=lambda _run, _proposal: None,
            placement=None,
        )
        where = message_context()
        source = Source(names.proposals, where.partition, where.offset, key, value, timestamp)
        records = outcome_records(names, outcome, source)
        if isinstance(outcome, Commit):
            # The run's snapshot, last of a commit's records (Quix changelogs it).
            encoded = records[-1].value
            assert encoded is not None  # a commit's snapshot is never a tombstone
            state.set(SNAPSHOT, encoded.decode())
        return [r for r in records if r.topic != names.changelog]

    sdf = app.dataframe(proposals)
    sdf = sdf.apply(decide, stateful=True, metadata=True, expand=True)
    sdf.to_topic(lambda value, *_: outputs[value.topic], key=lambda value: value.key)
    app.run()


if __name__ == "__main__":
    main()
