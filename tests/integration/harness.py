"""Drive real worker processes and read back what they published, for integration tests."""

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, Message

from processor.client import RunstateClient
from processor.engine import Beat, Commit, Forget
from processor.history.rebuild import partition_count
from processor.kafka.config import KafkaSettings
from processor.kafka.readback import read_topics
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines
from processor.records.changelog_keys import is_run_key
from processor.records.intake import TimestampType
from processor.records.pipeline import Outcome, Placement, RunsInMemory, decide_record
from processor.runtimes.native.process import WorkerProcess as ProductWorkerProcess
from processor.trust.keygen import generate_keyring
from processor.trust.keyring import Keyring, SigningKey, dump_keyring, signing_key_from
from schemas.messages import Heartbeat, Proposal, Rejection, RunSnapshot, Transition

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Env:
    bootstrap: str
    topics: TopicNames
    keyring: Keyring
    keyring_path: Path
    tmp: Path
    group_id: str = field(default_factory=lambda: f"g-{uuid.uuid4().hex[:8]}")

    def client(self, key_id: str = "runtime", timeout: float = 30.0) -> RunstateClient:
        return RunstateClient(
            KafkaSettings(self.bootstrap),
            self.topics,
            signing_key=self.signing_key(key_id),
            timeout=timeout,
        )

    def signing_key(self, key_id: str) -> SigningKey:
        return signing_key_from(self.keyring, key_id)

    def sign(
        self, key_id: str, key: bytes | None, value: bytes
    ) -> list[tuple[str, str | bytes | None]]:
        """Headers signing (key, value) for the proposals topic, now."""
        return self.signing_key(key_id).headers(
            self.topics.proposals, key, value, int(time.time() * 1000)
        )


def consume_all(bootstrap: str, topic: str, expected: int, **extra: str) -> list[Message]:
    """`topic` from the start through a fresh group's subscription, until `expected`
    records arrived (or 60 s), then a second more: anything beyond would be a bug."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **extra,
        }
    )
    consumer.subscribe([topic])
    found: list[Message] = []
    deadline = time.monotonic() + 60
    try:
        while len(found) < expected and time.monotonic() < deadline:
            found += [m for m in consumer.consume(500, timeout=0.5) if m.error() is None]
        found += [m for m in consumer.consume(500, timeout=1.0) if m.error() is None]
    finally:
        consumer.close()
    return found


def make_env(bootstrap: str, topics: TopicNames, tmp: Path) -> Env:
    keyring = generate_keyring()  # HMAC: the tests sign as every principal from it
    path = tmp / "keyring.json"
    path.write_text(dump_keyring(keyring))
    return Env(bootstrap, topics, keyring, path, tmp)


def runstate(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    """`runstate ARGS` against the test's broker and topics, with no RUNSTATE_* of the
    caller's environment in the way."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RUNSTATE_")}
    clean["COLUMNS"] = "200"
    prefix = env.topics.proposals.removesuffix("proposals")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "processor.cli.main",
            *args,
            "--bootstrap-servers",
            env.bootstrap,
            "--topic-prefix",
            prefix,
        ],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=300,
    )


#: The worker processes a test started, for their stacks when outcomes do not come.
LIVE: "weakref.WeakSet[WorkerProcess]" = weakref.WeakSet()
#: How long a worker gets to write its stacks after SIGUSR1.
STACKS_WAIT_S = 5.0
#: The outermost frame of a worker's main thread.
MAIN_FRAME = "processor/cli/main.py"


class WorkerProcess(ProductWorkerProcess):
    """The product's worker process, wired to a test's topics, keyring and group."""

    def __init__(
        self,
        env: Env,
        state_dir: Path,
        *extra: str,
        runtime: str = "native",
        http_token: str | None = None,
        port: int | None = None,
    ) -> None:
        self.runtime = runtime
        super().__init__(
            http_token=http_token,  # the worker accepts it, and this object sends it
            port=port,
            bootstrap=env.bootstrap,
            topic_prefix=env.topics.proposals.removesuffix("proposals"),
            group_id=env.group_id,
            state_dir=state_dir,
            keyring_file=env.keyring_path,
            log_path=env.tmp / f"worker-{uuid.uuid4().hex[:6]}.log",
            extra_args=(
                "--runtime",
                runtime,
                "-X",
                "session.timeout.ms=6000",
                "-X",
                "heartbeat.interval.ms=1000",
                *extra,
            ),
        )
        LIVE.add(self)

    def stacks(self) -> str:
        """Its threads' stacks (SIGUSR1: faulthandler writes them to its log) and the end
        of its log; what it logged, when it is not running."""
        if self.proc.poll() is not None:
            return f"(exited {self.proc.returncode})\n{self.log()}"
        before = self.log_path.stat().st_size
        self.proc.send_signal(signal.SIGUSR1)
        # faulthandler writes one thread after another, the main thread (whose outermost
        # frame is the CLI's) last: the dump is whole once that one is in.
        with suppress(AssertionError):  # none after STACKS_WAIT_S: its log all the same
            eventually(
                "the main thread's stack in its log",
                lambda: True if MAIN_FRAME in self._since(before) else None,
                STACKS_WAIT_S,
            )
        return self.log_path.read_text(errors="replace")[-12_000:]

    def _since(self, offset: int) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def snapshot(self, run_id: str) -> RunSnapshot | None:
        data = self.get(self.run_path(run_id))
        return None if data is None else RunSnapshot.model_validate_json(json.dumps(data))

    def stop_cleanly(self) -> None:
        """SIGTERM: the worker exits 0, and nothing on its way out logged a traceback (a
        task that ended by an exception at a graceful stop is a defect too)."""
        assert self.terminate() == 0, self.log()
        log = self.log_path.read_text(errors="replace")
        assert "Traceback" not in log, log[max(0, log.index("Traceback") - 2000) :][:6000]


# -- workload -----------------------------------------------------------------
KEYS = ["runtime", "tool", "approver", "model"]
FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01: a decision that does not expire in a test
AUTHORITY_KEY = {"runtime": "runtime", "tool_executor": "tool", "approver": "approver"}


def workload(runs: int, proposals: int, seed: int = 7) -> list[dict[str, Any]]:
    """`proposals` proposals over `runs` runs of the three built-in machines, interleaved
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
            if state in machine.step_states and 0.25 <= roll < 0.3:
                item["event"], item["key"] = "heartbeat", "runtime"  # liveness, no revision
            elif state in machine.step_states and roll < 0.25:
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
                if spec.approval is not None:  # a decision names the pause it answers
                    item["payload"] = {"pause": revision, "expires_at_ms": FAR_FUTURE_MS}
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


def signed_records(
    env: Env, plan: list[dict[str, Any]]
) -> list[tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]]:
    """The plan as (key, value, headers), each signed with its principal's key."""
    out = []
    for item in plan:
        fields = {k: v for k, v in item.items() if k not in ("key", "run_id", "event")}
        value = Proposal(run_id=item["run_id"], event=item["event"], **fields)
        raw = value.model_dump_json(exclude_none=True).encode()
        key = item["run_id"].encode()
        out.append((key, raw, env.sign(item["key"], key, raw)))
    return out


def send(env: Env, plan: list[dict[str, Any]]) -> None:
    """One producer (so each run's proposals keep their order), each record signed with
    the key of the principal that proposes it."""
    client = env.client()
    for key, value, headers in signed_records(env, plan):
        client.send_raw(key, value, headers)
    client.flush(60)
    client.close()


# -- reading back ---------------------------------------------------------------
@dataclass
class Published:
    transitions: list[Transition]
    rejections: list[Rejection]
    dead_letters: int
    snapshots: dict[str, RunSnapshot]  # last changelog value per run
    heartbeats: list[Heartbeat] = field(default_factory=list)

    def outcome_counts(self) -> Counter[str]:
        ids = [t.proposal_id for t in self.transitions]
        ids += [h.proposal_id for h in self.heartbeats]
        ids += [r.proposal_id for r in self.rejections if r.proposal_id is not None]
        return Counter(ids)


def published(env: Env) -> Published:
    t = env.topics
    records = read_topics(
        KafkaSettings(env.bootstrap),
        [t.transitions, t.rejections, t.dlq, t.changelog, t.heartbeats],
    )
    transitions, rejections, dlq, snapshots, heartbeats = [], [], 0, {}, []
    for msg in records:
        topic = msg.topic()
        if topic == t.transitions:
            transitions.append(Transition.model_validate_json(msg.value()))
        elif topic == t.heartbeats:
            heartbeats.append(Heartbeat.model_validate_json(msg.value()))
        elif topic == t.rejections:
            rejections.append(Rejection.model_validate_json(msg.value()))
        elif topic == t.dlq:
            dlq += 1
        elif msg.value() is not None and is_run_key(msg.key()):
            snapshots[msg.key().decode()] = RunSnapshot.model_validate_json(msg.value())
    return Published(transitions, rejections, dlq, snapshots, heartbeats)


T = TypeVar("T")


def eventually(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    """What `probe` returns once it is not None, asked every 0.2 s: a wait on a condition
    with a deadline (AssertionError naming `what` after `timeout` seconds), never a
    fixed sleep that hopes the condition holds by then."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(0.2)


def wait_for_outcomes(
    env: Env, expected: int | list[dict[str, Any]], timeout: float = 180.0
) -> Published:
    """Until every proposal of a plan has an outcome (given a plan), or until `expected`
    outcomes (transitions + rejections + DLQ records) are visible (given a count)."""
    deadline = time.monotonic() + timeout
    while True:
        result = published(env)
        if isinstance(expected, int):
            total = len(result.transitions) + len(result.rejections) + result.dead_letters
            done = total >= expected
        else:
            counts = result.outcome_counts()
            done = all(counts[p["proposal_id"]] for p in expected)
        if done:
            return result
        if time.monotonic() > deadline:
            # Shown with the test's failure (captured output): where each worker stands.
            for worker in list(LIVE):
                print(f"--- {worker.runtime} worker {worker.log_path.name}: stacks and log")
                print(worker.stacks())
            return result
        time.sleep(1.0)


def decided_records(env: Env) -> Iterator[tuple[Message, Outcome]]:
    """Every record of the proposals topic with the outcome the pure pipeline gives it,
    deciding from offset 0 (runs live in one partition, so one pass in read order)."""
    machines = builtin_machines()
    runs = RunsInMemory()
    settings = KafkaSettings(env.bootstrap)
    partitions = partition_count(settings, env.topics.proposals)
    for msg in read_topics(settings, [env.topics.proposals]):
        outcome = decide_record(
            msg.key(),
            msg.value(),
            msg.headers(),
            msg.timestamp()[1],
            topic=env.topics.proposals,
            keyring=env.keyring,
            machines=machines,
            lookup=runs.lookup,
            seen=runs.seen,
            placement=Placement(msg.partition() or 0, partitions),
            timestamp_type=TimestampType.of_librdkafka(msg.timestamp()[0]),
        )
        runs.apply(outcome)
        yield msg, outcome


def replay(env: Env) -> tuple[dict[str, RunSnapshot], dict[str, str]]:
    """Decide the proposals topic again with the pure pipeline: the final snapshot of
    every run and the outcome kind of every proposal id."""
    state: dict[str, RunSnapshot] = {}
    outcomes: dict[str, str] = {}
    for _, outcome in decided_records(env):
        if isinstance(outcome, Commit | Beat):
            state[outcome.snapshot.run_id] = outcome.snapshot
        if isinstance(outcome, Forget):
            state.pop(outcome.transition.run_id, None)
            outcomes[outcome.transition.proposal_id] = "transition"
        if isinstance(outcome, Commit):
            outcomes[outcome.transition.proposal_id] = "transition"
        elif isinstance(outcome, Rejection) and outcome.proposal_id is not None:
            outcomes.setdefault(outcome.proposal_id, outcome.code.value)
    return state, outcomes


def assert_guarantee(
    env: Env, plan: list[dict[str, Any]], result: Published, runtime: str = "native"
) -> None:
    """The runtime's delivery guarantee (README, Guarantees per runtime), then what both
    share: snapshots equal the replay, each run's revisions contiguous from 0."""
    if runtime == "native":
        assert_exactly_once(plan, result)
    else:
        assert_at_least_once_recognisable(plan, result)
    assert_state_matches_replay(env, result)


def assert_exactly_once(plan: list[dict[str, Any]], result: Published) -> None:
    """Every proposal exactly one outcome; no transition id twice."""
    counts = result.outcome_counts()
    missing = [p["proposal_id"] for p in plan if counts[p["proposal_id"]] == 0]
    doubled = [pid for pid, n in counts.items() if n > 1]
    assert not missing, f"{len(missing)} proposals without an outcome, e.g. {missing[:5]}"
    assert not doubled, f"{len(doubled)} proposals with several outcomes, e.g. {doubled[:5]}"
    ids = Counter(t.transition_id for t in result.transitions)
    assert all(n == 1 for n in ids.values()), "a transition id appears twice"
    assert not [t for t in result.transitions if t.event == "heartbeat"], "a beat committed"


def assert_at_least_once_recognisable(plan: list[dict[str, Any]], result: Published) -> None:
    """The Faust runtime's guarantee: every proposal at least one outcome; a repeated
    transition is byte-for-byte the same record (same transition_id); a proposal is
    committed at most once, any further outcome being a `duplicate` naming that commit
    or a repeat of the same rejection."""
    counts = result.outcome_counts()
    missing = [p["proposal_id"] for p in plan if counts[p["proposal_id"]] == 0]
    assert not missing, f"{len(missing)} proposals without an outcome, e.g. {missing[:5]}"
    copies: dict[str, list[Transition]] = defaultdict(list)
    committed: dict[str, set[str]] = defaultdict(set)
    for t in result.transitions:
        copies[t.transition_id].append(t)
        committed[t.proposal_id].add(t.transition_id)
    for transition_id, same in copies.items():
        for t in same[1:]:
            differ = {
                name: (getattr(same[0], name), getattr(t, name))
                for name in type(t).model_fields
                if getattr(t, name) != getattr(same[0], name)
            }
            assert not differ, f"copies of {transition_id} differ: {differ}"
    assert all(len(ids) == 1 for ids in committed.values()), "a proposal committed twice"
    refused: dict[str, set[tuple[str, str]]] = defaultdict(set)
    seen_as: dict[str, list[tuple[str | None, int | None]]] = defaultdict(list)
    for r in result.rejections:
        if r.proposal_id is None:
            continue
        if r.code.value == "duplicate" and r.original_transition_id is None:
            # a heartbeat not taken (taken already, or signed before the latest one taken
            # or the run's latest transition): no commit to name, nothing changed
            assert r.event == "heartbeat", r
        elif r.code.value == "duplicate":
            assert r.original_transition_id in committed[r.proposal_id], r
        else:
            refused[r.proposal_id].add((r.code.value, r.detail))
            seen_as[r.proposal_id].append((r.state, r.revision))
            assert not committed[r.proposal_id], (
                f"{r.proposal_id} committed as {sorted(committed[r.proposal_id])} and refused "
                f"{r.code.value}: {r.detail} (state {r.state}, revision {r.revision})"
            )
    differently = {
        pid: (sorted(kinds), seen_as[pid]) for pid, kinds in refused.items() if len(kinds) > 1
    }
    assert not differently, f"proposals refused differently: {differently}"


def assert_serves_changelog(
    worker: WorkerProcess, env: Env, before: dict[str, RunSnapshot]
) -> dict[str, RunSnapshot]:
    """The worker serves the rebuilt snapshots. Retry deadlines that came due while no
    worker ran fire as it starts and move some runs on, so a run may be ahead of
    `before`: then it must equal the changelog's newest snapshot, read again until the
    worker's commits have all arrived (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        latest = published(env).snapshots
        served = {run_id: worker.snapshot(run_id) for run_id in before}
        ahead = {r for r, s in served.items() if s != before[r]}
        if all(served[r] == latest.get(r) for r in ahead) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    for run_id, snapshot in served.items():
        assert snapshot is not None and snapshot.revision >= before[run_id].revision
        assert snapshot == (before[run_id] if run_id not in ahead else latest[run_id])
    return {r: s for r, s in served.items() if s is not None}


def assert_state_matches_replay(env: Env, result: Published) -> None:
    """The changelog's snapshots equal a replay of the proposals topic. Deadlines the
    worker proposes (retry backoff) keep arriving for a few seconds after a workload,
    so both sides are read again until they agree or 30 s have passed."""
    deadline = time.monotonic() + 30
    while True:
        expected, expected_outcomes = replay(env)
        if result.snapshots == expected or time.monotonic() > deadline:
            break
        time.sleep(1.0)
        result = published(env)
    assert result.snapshots == expected, "changelog snapshots differ from the replay"
    for t in result.transitions:
        assert expected_outcomes[t.proposal_id] == "transition"
    for r in result.rejections:
        if r.proposal_id is not None and r.code.value != "duplicate":
            assert expected_outcomes[r.proposal_id] == r.code.value
    # revisions of each run are contiguous from 0
    revisions: dict[str, list[int]] = defaultdict(list)
    for t in result.transitions:
        revisions[t.run_id].append(t.revision)
    for run_id, revs in revisions.items():
        distinct = sorted(set(revs))  # repeats are the runtime guarantee's business
        assert distinct == list(range(len(distinct))), f"{run_id}: revisions {distinct}"
