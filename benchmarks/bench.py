"""One broker and one keyring for a benchmark session: a fresh set of topics and a
work dir per measurement, and the input signed for them."""

import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient
from rich.console import Console

from benchmarks.contenders import Setup
from benchmarks.records import RawRecord
from benchmarks.workload import BENCH_MAX_AGE_MS, for_topic, lives, signed
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames
from processor.trust.keygen import generate_keyring
from processor.trust.keyring import Keyring, dump_keyring
from schemas.messages import Proposal

PARTITIONS = 3


class Bench:
    """One broker, one keyring; a fresh set of topics and a work dir per measurement."""

    def __init__(self, bootstrap: str, tmp: Path, console: Console) -> None:
        self.bootstrap, self.tmp, self.console = bootstrap, tmp, console
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
        self.keyring: Keyring = generate_keyring().model_copy(
            update={"signature_max_age_ms": BENCH_MAX_AGE_MS}
        )
        self.keyring_path = tmp / "keyring.json"
        self.keyring_path.write_text(dump_keyring(self.keyring))

    def setup(self, label: str) -> Setup:
        prefix = f"b-{uuid.uuid4().hex[:8]}."
        create_topics(self.admin, plan_topics(TopicNames.with_prefix(prefix), PARTITIONS, 1))
        workdir = self.tmp / f"{label}-{prefix.rstrip('.')}"
        workdir.mkdir()
        return Setup(
            self.bootstrap, prefix, self.keyring_path, workdir, f"g-{prefix}", self.console
        )

    def signed_for(self, setup: Setup, records: list[RawRecord]) -> list[RawRecord]:
        """`records` signed for this setup's proposals topic, now."""
        return for_topic(records, self.keyring, setup.names.proposals)

    def records(self, runs: int, proposals: int, seed: int) -> list[RawRecord]:
        return lives(self.keyring, runs, proposals, seed)

    def creates(self, first: int, last: int) -> list[RawRecord]:
        return [
            signed(
                self.keyring,
                "runtime",
                Proposal(
                    run_id=f"m-{n}",
                    event="create",
                    payload={"machine": "task_lifecycle"},
                    proposal_id=f"m-{n}",
                ),
            )
            for n in range(first, last)
        ]
