"""Drive real worker processes and read back what they published, for integration tests."""

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from processor.broker.launcher import free_port
from processor.client import RunstateClient
from processor.config import KafkaSettings
from processor.engine import Commit
from processor.intake import signed_headers
from processor.keyring import Keyring, dump_keyring, generate_keyring
from processor.machines import builtin_machines
from processor.pipeline import DeadLetterReason, decide_record
from processor.topics import TopicNames
from schemas.messages import Proposal, Rejection, RunSnapshot, Transition

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Env:
    bootstrap: str
    topics: TopicNames
    keyring: Keyring
    keyring_path: Path
    tmp: Path
    group_id: str = field(default_factory=lambda: f"g-{uuid.uuid4().hex[:8]}")

    def client(self, key_id: str = "runtime") -> RunstateClient:
        return RunstateClient(
            KafkaSettings(self.bootstrap),
            self.topics,
            key_id=key_id,
            secret=self.keyring.keys[key_id].secret,
        )


def make_env(bootstrap: str, topics: TopicNames, tmp: Path) -> Env:
    keyring = generate_keyring()
    path = tmp / "keyring.json"
    path.write_text(dump_keyring(keyring))
    return Env(bootstrap, topics, keyring, path, tmp)


class WorkerProcess:
    """`runstate worker` in a subprocess, as an operator would run it."""

    def __init__(self, env: Env, state_dir: Path, *extra: str) -> None:
        self.env = env
        self.state_dir = state_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = env.tmp / f"worker-{uuid.uuid4().hex[:6]}.log"
        prefix = env.topics.proposals.removesuffix("proposals")
        command = [
            sys.executable,
            "-m",
            "processor.cli.main",
            "worker",
            "--bootstrap-servers",
            env.bootstrap,
            "--topic-prefix",
            prefix,
            "--group-id",
            env.group_id,
            "--state-dir",
            str(state_dir),
            "--keyring-file",
            str(env.keyring_path),
            "--http-port",
            str(self.port),
            "-X",
            "session.timeout.ms=6000",
            "-X",
            "heartbeat.interval.ms=1000",
            *extra,
        ]
        clean_env = {k: v for k, v in os.environ.items() if not k.startswith("RUNSTATE_")}
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            command, cwd=ROOT, env=clean_env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def health(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                data: dict[str, Any] = json.loads(response.read())
                return data
        except OSError:
            return None

    def wait_ready(self, partitions: int | None = None, timeout: float = 60.0) -> None:
        """Until the HTTP API answers (and owns `partitions` partitions, if given)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited {self.proc.returncode}:\n{self.log()}")
            health = self.health()
            if health is not None and (
                partitions is None or len(health["partitions"]) == partitions
            ):
                return
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready in {timeout}s:\n{self.log()}")

    def terminate(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> int:
        self.proc.kill()
        return self.wait(30)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._log.close()
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def snapshot(self, run_id: str) -> RunSnapshot | None:
        try:
            with urllib.request.urlopen(
                f"{self.url}/runs/{urllib.request.quote(run_id, safe='')}", timeout=5
            ) as response:
                return RunSnapshot.model_validate_json(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise


# -- workload -----------------------------------------------------------------
KEYS = ["runtime", "tool", "approver", "model"]
AUTHORITY_KEY = {"runtime": "runtime", "tool_executor": "tool", "approver": "approver"}


def workload(runs: int, proposals: int, seed: int = 7) -> list[dict[str, Any]]:
    """`proposals` proposals over `runs` runs of the three seed machines, interleaved
    across runs, each run's own order kept. Mostly realistic lives (the legal next
    event, from a principal allowed to send it; steps while running; facts; reasons),
    with a share of mistakes: wrong principals, illegal events, stale revisions, missing
    reasons, repeated steps. Deterministic for a seed."""
    rng = random.Random(seed)
    machines = builtin_machines()
    names = sorted(machines)
    per_run: list[list[dict[str, Any]]] = []
    for r in range(runs):
        run_id = f"run-{seed}-{r}"
        machine = machines[names[r % len(names)]]
        items: list[dict[str, Any]] = [
            {
                "run_id": run_id,
                "event": "create",
                "key": "runtime",
                "payload": {"machine": machine.name, "options": {"max_retries": rng.randint(0, 3)}},
            }
        ]
        state, revision = machine.spec.initial, 0
        for i in range(proposals // runs - 1):
            item: dict[str, Any] = {"run_id": run_id}
            edges = [e for (src, _), e in machine.edges.items() if src == state]
            roll = rng.random()
            if state in machine.step_states and roll < 0.25:
                step = rng.choice(["charge", "notify"])
                item["event"] = rng.choice(["step_started", "step_succeeded", "step_failed"])
                item["payload"] = {
                    "step_started": {"step": step, "idempotency_key": f"{run_id}:{step}"},
                    "step_succeeded": {"step": step, "result": {"n": i}},
                    "step_failed": {"step": step, "error": "gateway 503"},
                }[item["event"]]
                item["key"] = "runtime"
            elif edges and roll < 0.85:
                edge = rng.choice(edges)
                spec = machine.events[edge.event]
                item["event"] = edge.event
                item["key"] = AUTHORITY_KEY[rng.choice(spec.authorities)]
                if spec.records_fact:
                    item["payload"] = {
                        "fact": rng.choice(["build=green", "build=green", "build=red"])
                    }
                if edge.reasons and rng.random() < 0.9:
                    item["reason"] = rng.choice(sorted(edge.reasons))
                # Assume it commits; a refusal (guard, budget) just keeps the real state
                # behind the guess, which later proposals then meet as mistakes.
                state, revision = edge.target, revision + 1
            else:  # a mistake
                item["event"] = rng.choice([*machine.events, "no_such_event"])
                item["key"] = rng.choice(KEYS)
            if rng.random() < 0.1:
                item["expected_revision"] = revision - rng.randint(0, 2)
            items.append(item)
        per_run.append(items)
    plan: list[dict[str, Any]] = []
    while per_run:
        queue = rng.choice(per_run)
        plan.append(queue.pop(0))
        if not queue:
            per_run.remove(queue)
    for n, item in enumerate(plan):
        item["proposal_id"] = f"p-{seed}-{n}"
        if item.get("expected_revision", 0) < 0:
            del item["expected_revision"]
    return plan


def send(env: Env, plan: list[dict[str, Any]]) -> None:
    """One producer (so each run's proposals keep their order), each record signed with
    the key of the principal that proposes it."""
    client = env.client()
    for item in plan:
        fields = {k: v for k, v in item.items() if k not in ("key", "run_id", "event")}
        value = Proposal(run_id=item["run_id"], event=item["event"], **fields)
        raw = value.model_dump_json(exclude_none=True).encode()
        secret = env.keyring.keys[item["key"]].secret
        client.send_raw(item["run_id"].encode(), raw, signed_headers(raw, item["key"], secret))
    client.flush(60)
    client.close()


# -- reading back ---------------------------------------------------------------
def _read_all(
    bootstrap: str, topics: list[str], *, committed: bool = True
) -> list[tuple[str, int, int, Any]]:
    """Every record of `topics`, in partition order: (topic, partition, offset, msg)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "log_level": 3,
        }
    )
    assignment = []
    for topic in topics:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        for p in meta.partitions:
            assignment.append(TopicPartition(topic, p, 0))
    consumer.assign(assignment)
    remaining = {(tp.topic, tp.partition) for tp in assignment}
    out = []
    deadline = time.monotonic() + 120
    while remaining and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=1000, timeout=0.5):
            if msg.error() is not None:
                if msg.error().code() == -191:  # _PARTITION_EOF
                    remaining.discard((msg.topic(), msg.partition()))
                continue
            out.append((msg.topic(), msg.partition(), msg.offset(), msg))
    consumer.close()
    return out


@dataclass
class Published:
    transitions: list[Transition]
    rejections: list[Rejection]
    dead_letters: int
    snapshots: dict[str, RunSnapshot]  # last changelog value per run

    def outcome_counts(self) -> Counter[str]:
        ids = [t.proposal_id for t in self.transitions]
        ids += [r.proposal_id for r in self.rejections if r.proposal_id is not None]
        return Counter(ids)


def published(env: Env) -> Published:
    t = env.topics
    records = _read_all(env.bootstrap, [t.transitions, t.rejections, t.dlq, t.changelog])
    transitions, rejections, dlq, snapshots = [], [], 0, {}
    for topic, _, _, msg in records:
        if topic == t.transitions:
            transitions.append(Transition.model_validate_json(msg.value()))
        elif topic == t.rejections:
            rejections.append(Rejection.model_validate_json(msg.value()))
        elif topic == t.dlq:
            dlq += 1
        elif msg.value() is not None:
            snapshots[msg.key().decode()] = RunSnapshot.model_validate_json(msg.value())
    return Published(transitions, rejections, dlq, snapshots)


def wait_for_outcomes(env: Env, expected: int, timeout: float = 180.0) -> Published:
    """Until `expected` outcomes (transitions + rejections + DLQ records) are visible."""
    deadline = time.monotonic() + timeout
    while True:
        result = published(env)
        total = len(result.transitions) + len(result.rejections) + result.dead_letters
        if total >= expected or time.monotonic() > deadline:
            return result
        time.sleep(1.0)


def replay(env: Env) -> tuple[dict[str, RunSnapshot], dict[str, str]]:
    """Decide the proposals topic again from offset 0 with the pure pipeline: the final
    snapshot of every run and the outcome kind of every proposal id."""
    machines = builtin_machines()
    state: dict[str, RunSnapshot] = {}
    outcomes: dict[str, str] = {}
    by_partition: dict[int, list[Any]] = defaultdict(list)
    for _, partition, _, msg in _read_all(env.bootstrap, [env.topics.proposals]):
        by_partition[partition].append(msg)
    for msgs in by_partition.values():
        for msg in msgs:
            outcome = decide_record(
                msg.key(),
                msg.value(),
                msg.headers(),
                msg.timestamp()[1],
                keyring=env.keyring,
                machines=machines,
                lookup=state.get,
            )
            if isinstance(outcome, Commit):
                state[outcome.snapshot.run_id] = outcome.snapshot
                outcomes[outcome.transition.proposal_id] = "transition"
            elif isinstance(outcome, Rejection) and outcome.proposal_id is not None:
                outcomes.setdefault(outcome.proposal_id, outcome.code.value)
            elif isinstance(outcome, DeadLetterReason):
                pass
    return state, outcomes


def assert_exactly_once(env: Env, plan: list[dict[str, Any]], result: Published) -> None:
    """Every proposal one outcome; no transition twice; snapshots equal the replay."""
    counts = result.outcome_counts()
    missing = [p["proposal_id"] for p in plan if counts[p["proposal_id"]] == 0]
    doubled = [pid for pid, n in counts.items() if n > 1]
    assert not missing, f"{len(missing)} proposals without an outcome, e.g. {missing[:5]}"
    assert not doubled, f"{len(doubled)} proposals with several outcomes, e.g. {doubled[:5]}"
    ids = Counter(t.transition_id for t in result.transitions)
    assert all(n == 1 for n in ids.values()), "a transition id appears twice"
    expected, expected_outcomes = replay(env)
    assert result.snapshots == expected, "changelog snapshots differ from the replay"
    for t in result.transitions:
        assert expected_outcomes[t.proposal_id] == "transition"
    for r in result.rejections:
        if r.proposal_id is not None:
            assert expected_outcomes[r.proposal_id] == r.code.value
    # revisions of each run are contiguous from 0
    revisions: dict[str, list[int]] = defaultdict(list)
    for t in result.transitions:
        revisions[t.run_id].append(t.revision)
    for run_id, revs in revisions.items():
        assert sorted(revs) == list(range(len(revs))), f"{run_id}: revisions {sorted(revs)}"
