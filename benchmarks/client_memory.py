"""What an agent's outcome waiter costs in memory while other runs' outcomes pass
through the cluster: the waiter the SDK had before (every partition, every outcome
kept) side by side with the client's scoped waiter (its runs' partitions, its proposals'
outcomes only).

On a real broker (RUNSTATE_BOOTSTRAP_SERVERS, else Docker, else the local launcher): each
peer runs in a process of its own and starts following outcomes (the scoped client has
registered one proposal of its own run); then N synthetic outcomes of other runs (80 %
transitions, 20 % rejections, about 500 bytes each, keyed by run id like the worker's)
are produced straight to the output topics, no worker needed; each peer reads until it
has seen every record of the partitions it follows, and reports its resident memory.

    .venv/bin/python -m benchmarks.client_memory --outcomes 1000000

Prints one JSON object: each peer's RSS before and after, what it read and kept, and the
ratio of their RSS after (legacy / scoped).
"""

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from rich.console import Console

from processor.broker.provide import provide_broker
from processor.client import (
    KafkaSettings,
    RejectionCode,
    RunstateClient,
    SigningKey,
    TopicNames,
)
from processor.kafka.partitioning import partition_for
from processor.kafka.readback import watermarks
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import plan_topics
from schemas.messages import Heartbeat, Principal, Rejection, Transition

PARTITIONS = 6
OWN_RUN = "the-agents-own-run"


def _rss_kib() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return {"rss_kib": fields["VmRSS"], "peak_rss_kib": fields["VmHWM"]}


class LegacyWaiter:
    """The SDK's waiter before the scoped one, as it was: every partition of the three
    output topics from their end, every outcome kept by proposal id for ever."""

    def __init__(self, settings: KafkaSettings, topics: TopicNames) -> None:
        self._consumer = Consumer(
            settings.client(
                {
                    "group.id": f"runstate-client-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                }
            )
        )
        self._topics = topics
        self._outcomes: dict[str, Transition | Heartbeat | Rejection] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        assignment = []
        for topic in (topics.transitions, topics.rejections, topics.heartbeats):
            meta = self._consumer.list_topics(topic, timeout=30).topics[topic]
            for p in meta.partitions:
                _, high = watermarks(self._consumer, TopicPartition(topic, p))
                assignment.append(TopicPartition(topic, p, high))
        self._consumer.assign(assignment)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            batch = self._consumer.consume(num_messages=1_000, timeout=0.2)
            parsed: list[Transition | Heartbeat | Rejection] = []
            for msg in batch:
                if msg.error() is not None:
                    continue
                value = msg.value() or b""
                outcome: Transition | Heartbeat | Rejection
                if msg.topic() == self._topics.transitions:
                    outcome = Transition.model_validate_json(value)
                elif msg.topic() == self._topics.heartbeats:
                    outcome = Heartbeat.model_validate_json(value)
                else:
                    outcome = Rejection.model_validate_json(value)
                parsed.append(outcome)
            if parsed:
                with self._cond:
                    for outcome in parsed:
                        if outcome.proposal_id is not None:
                            self._outcomes.setdefault(outcome.proposal_id, outcome)
                    self._cond.notify_all()

    def read(self) -> int:
        with self._cond:
            return len(self._outcomes)  # every record has its own proposal id

    def kept(self) -> int:
        return self.read()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


class ScopedPeer:
    """The SDK's client, having proposed for one run of its own (registered, not sent:
    no worker runs here)."""

    def __init__(self, settings: KafkaSettings, topics: TopicNames) -> None:
        key = SigningKey.hmac("runtime", "a-benchmark-secret-of-32-chars!!")
        self.client = RunstateClient(settings, topics, signing_key=key)
        self.client.outcomes.expect(OWN_RUN, "own-proposal")

    def read(self) -> int:
        return self.client.outcomes.read

    def kept(self) -> int:
        return self.client.outcomes.kept()

    def close(self) -> None:
        self.client.close()


def child(peer: str, bootstrap: str, prefix: str) -> None:
    """One peer: follow, say so, wait for the count to read, read it, report."""
    settings, topics = KafkaSettings(bootstrap), TopicNames.with_prefix(prefix)
    waiter = LegacyWaiter(settings, topics) if peer == "legacy" else ScopedPeer(settings, topics)
    print(json.dumps({"ready": True, **_rss_kib()}), flush=True)
    expected = int(sys.stdin.readline())
    began = time.monotonic()
    while waiter.read() < expected:
        if time.monotonic() - began > 1800:
            raise SystemExit(f"{peer}: read {waiter.read()} of {expected} in 30 minutes")
        time.sleep(0.2)
    time.sleep(1.0)  # anything past the count would show up now
    report: dict[str, Any] = {"read": waiter.read(), "kept": waiter.kept(), **_rss_kib()}
    report["read_s"] = round(time.monotonic() - began, 1)
    print(json.dumps(report), flush=True)
    waiter.close()


def produce_others(bootstrap: str, topics: TopicNames, n: int) -> dict[int, int]:
    """N outcomes of other runs, keyed by run id; how many landed in each partition."""
    principal = Principal(source="agent:other", authority="runtime")
    transition = Transition(
        transition_id="RUN:1",
        run_id="RUN",
        machine="task_lifecycle",
        revision=1,
        from_state="planned",
        to_state="running",
        event="start",
        proposal_id="PID",
        principal=principal,
        payload={"note": "x" * 120},
        at_ms=int(time.time() * 1000),
        prev_hash="0" * 64,
        hash="f" * 64,
    ).model_dump_json()
    rejection = Rejection(
        code=RejectionCode.INVALID_TRANSITION,
        detail="event 'start' is not allowed in state 'running' of machine task_lifecycle",
        proposal_id="PID",
        run_id="RUN",
        at_ms=int(time.time() * 1000),
    ).model_dump_json()
    producer = Producer(
        KafkaSettings(bootstrap).client(
            {"partitioner": "murmur2_random", "linger.ms": 50, "compression.type": "lz4"}
        )
    )
    per_partition = dict.fromkeys(range(PARTITIONS), 0)
    for i in range(n):
        run_id = f"other-{i}"
        pid = f"other-proposal-{i}"
        template, topic = (
            (rejection, topics.rejections) if i % 5 == 4 else (transition, topics.transitions)
        )
        value = template.replace('"RUN', f'"{run_id}').replace('"PID"', f'"{pid}"').encode()
        while True:
            try:
                producer.produce(topic, value, run_id.encode())
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        per_partition[partition_for(run_id, PARTITIONS)] += 1
    assert producer.flush(300) == 0, "not every synthetic outcome was delivered"
    return per_partition


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outcomes", type=int, default=1_000_000, help="other runs' outcomes")
    parser.add_argument("--child", choices=["legacy", "scoped"], help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.bootstrap, args.prefix)
        return
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory() as tmp, provide_broker(Path(tmp) / "broker") as bootstrap:
        prefix = f"mem-{uuid.uuid4().hex[:8]}."
        topics = TopicNames.with_prefix(prefix)
        create_topics(
            AdminClient({"bootstrap.servers": bootstrap}), plan_topics(topics, PARTITIONS, 1)
        )
        peers: dict[str, subprocess.Popen[str]] = {}
        before: dict[str, Any] = {}
        for peer in ("legacy", "scoped"):
            peers[peer] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.client_memory",
                    "--child",
                    peer,
                    "--bootstrap",
                    bootstrap,
                    "--prefix",
                    prefix,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            stdout = peers[peer].stdout
            assert stdout is not None
            before[peer] = json.loads(stdout.readline())
        console.print(f"producing {args.outcomes:,} outcomes of other runs")
        began = time.monotonic()
        per_partition = produce_others(bootstrap, topics, args.outcomes)
        produced_s = time.monotonic() - began
        expected = {
            "legacy": args.outcomes,
            "scoped": per_partition[partition_for(OWN_RUN, PARTITIONS)],
        }
        after: dict[str, Any] = {}
        for peer, proc in peers.items():
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(f"{expected[peer]}\n")
            proc.stdin.flush()
        for peer, proc in peers.items():
            assert proc.stdout is not None
            console.print(f"waiting for {peer} to read {expected[peer]:,}")
            after[peer] = json.loads(proc.stdout.readline())
            proc.wait(60)
    result = {
        "outcomes_of_other_runs": args.outcomes,
        "partitions": PARTITIONS,
        "produced_s": round(produced_s, 1),
        "legacy": {
            "follows": "every partition",
            "rss_kib_before": before["legacy"]["rss_kib"],
            **after["legacy"],
        },
        "scoped": {
            "follows": "its run's partition of each output topic",
            "rss_kib_before": before["scoped"]["rss_kib"],
            **after["scoped"],
        },
    }
    result["rss_ratio_legacy_over_scoped"] = round(
        after["legacy"]["rss_kib"] / after["scoped"]["rss_kib"], 1
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
