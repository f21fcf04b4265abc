"""One broker and its keys for a benchmark session: a fresh set of topics and a work dir
per measurement, and the input signed for them. The input is signed as agents sign
(Ed25519, the keys `runstate keys generate` makes); a setup may ask for HMAC instead."""

import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient
from rich.console import Console

from benchmarks.contenders import Setup
from benchmarks.records import RawRecord
from benchmarks.workload import Keys, for_topic, lives, signed
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames
from processor.trust.keyfiles import write_signing_key
from processor.trust.keygen import PROCESSOR_KEY_ID
from processor.trust.keyring import Keyring, dump_keyring
from processor.trust.signatures import Algorithm
from schemas.messages import Proposal

PARTITIONS = 3


class Bench:
    """One broker, keys of each algorithm; a fresh set of topics and a work dir per
    measurement."""

    def __init__(self, bootstrap: str, tmp: Path, console: Console) -> None:
        self.bootstrap, self.tmp, self.console = bootstrap, tmp, console
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
        self.keys = {algorithm: Keys.generate(algorithm) for algorithm in Algorithm}
        self.keyring_paths: dict[Algorithm, Path] = {}
        for algorithm, keys in self.keys.items():
            self.keyring_paths[algorithm] = tmp / f"keyring-{algorithm}.json"
            self.keyring_paths[algorithm].write_text(dump_keyring(keys.keyring))
        # The workers sign their deadlines with their own key, as `runstate keys
        # generate` leaves it for them.
        self.timer_key_path = write_signing_key(
            tmp / "worker.key.json", self.keys[Algorithm.ED25519].signers[PROCESSOR_KEY_ID]
        )

    @property
    def keyring(self) -> Keyring:
        """The keyring the input is walked and signed with (Ed25519)."""
        return self.keys[Algorithm.ED25519].keyring

    def setup(self, label: str, algorithm: Algorithm = Algorithm.ED25519) -> Setup:
        prefix = f"b-{uuid.uuid4().hex[:8]}."
        create_topics(self.admin, plan_topics(TopicNames.with_prefix(prefix), PARTITIONS, 1))
        workdir = self.tmp / f"{label}-{prefix.rstrip('.')}"
        workdir.mkdir()
        return Setup(
            self.bootstrap,
            prefix,
            self.keyring_paths[algorithm],
            workdir,
            f"g-{prefix}",
            self.console,
            algorithm,
            self.timer_key_path if algorithm is Algorithm.ED25519 else None,
        )

    def signed_for(self, setup: Setup, records: list[RawRecord]) -> list[RawRecord]:
        """`records` signed for this setup's proposals topic, now, with its algorithm."""
        return for_topic(records, self.keys[setup.algorithm], setup.names.proposals)

    def records(self, runs: int, proposals: int, seed: int) -> list[RawRecord]:
        return lives(self.keys[Algorithm.ED25519], runs, proposals, seed)

    def creates(self, first: int, last: int) -> list[RawRecord]:
        return [
            signed(
                self.keys[Algorithm.ED25519],
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
