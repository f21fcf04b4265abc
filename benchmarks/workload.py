"""The benchmark's input: lives of runs of the three built-in machines, about 10 % refused.

Each run is walked with the engine itself, so the input stays realistic (the legal next
event, from a principal allowed to send it, with the reason or fact the machine asks
for, step records while running) and the refused share is what was asked for: a
mistake (a principal without authority, an event the state does not allow, a stale
expected revision) replaces a legal proposal with probability `refused`. Runs are
interleaved; each run's own order is kept."""

import itertools
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.records import RawRecord
from processor.engine import Commit, Machine
from processor.machines import builtin_machines
from processor.records.pipeline import decide_record
from processor.trust.keygen import generate_keys
from processor.trust.keyring import Keyring, SigningKey
from processor.trust.signatures import HEADER_KEY_ID, Algorithm
from schemas.messages import Proposal, RunSnapshot

T0_MS = 1_800_000_000_000


TOPIC = "runstate.proposals"
#: A workload is signed once and sent over minutes (and to topics of other names, see
#: `for_topic`): its keyring takes signatures up to a day old.
BENCH_MAX_AGE_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Keys:
    """A keyring (what a contender verifies with) and each of its keys' signing half
    (what the agents sign with), the standard principals' key ids either way."""

    keyring: Keyring
    signers: Mapping[str, SigningKey]

    @classmethod
    def generate(cls, algorithm: Algorithm) -> "Keys":
        keyring, signers = generate_keys(algorithm)
        return cls(keyring.model_copy(update={"signature_max_age_ms": BENCH_MAX_AGE_MS}), signers)


def signed(keys: Keys, key_id: str, proposal: Proposal, at_ms: int = T0_MS) -> RawRecord:
    """`proposal` as its record on the proposals topic, signed with key `key_id`."""
    value = proposal.model_dump_json(exclude_none=True).encode()
    key = proposal.run_id.encode()
    return RawRecord(key, value, keys.signers[key_id].headers(TOPIC, key, value, at_ms))


def for_topic(records: list[RawRecord], keys: Keys, topic: str) -> list[RawRecord]:
    """The records signed again for `topic`, now, with `keys` (a signature covers its
    topic and time; the key ids are the standard principals' whatever the algorithm);
    unsigned records stay as they are."""
    now = int(time.time() * 1000)
    out = []
    for record in records:
        key_id = dict(record.headers).get(HEADER_KEY_ID)
        if key_id is None or record.value is None:
            out.append(record)
            continue
        signer = keys.signers[key_id.decode() if isinstance(key_id, bytes) else key_id]
        headers = signer.headers(topic, record.key, record.value, now)
        out.append(replace(record, headers=headers))
    return out


class _Life:
    """One run being walked: its records so far and its snapshot as the engine left it."""

    def __init__(
        self, run_id: str, machine: Machine, keys: Keys, ids: Iterator[int], seed: int
    ) -> None:
        self.run_id, self.machine, self.keys, self.ids, self.seed = run_id, machine, keys, ids, seed
        self.snapshot: RunSnapshot | None = None
        self.records: list[RawRecord] = []

    def propose(self, event: str, key: str, **fields: Any) -> None:
        n = next(self.ids)
        proposal = Proposal(
            run_id=self.run_id, event=event, proposal_id=f"p-{self.seed}-{n}", **fields
        )
        record = signed(self.keys, key, proposal)
        outcome = decide_record(
            record.key,
            record.value,
            record.headers,
            T0_MS + n,
            topic=TOPIC,
            keyring=self.keys.keyring,
            machines={self.machine.name: self.machine},
            lookup=lambda _id: self.snapshot,
            seen=lambda _run, _proposal: None,
            placement=None,
        )
        self.records.append(record)
        if isinstance(outcome, Commit):
            self.snapshot = outcome.snapshot


#: An approval's expiry beyond any benchmark's clock.
_NEVER_MS = 2**53 - 1


def _key_for(machine: Machine, event: str, keyring: Keyring, rng: random.Random) -> str:
    if event == "create" or event.startswith("step_"):
        return "runtime"
    allowed = [
        k for k, e in keyring.keys.items() if e.authority in machine.events[event].authorities
    ]
    return rng.choice(sorted(allowed))


def lives(
    keys: Keys, runs: int, proposals: int, seed: int, refused: float = 0.1
) -> list[RawRecord]:
    keyring = keys.keyring
    rng = random.Random(seed)
    machines = builtin_machines()
    names = sorted(machines)
    length = max(2, proposals // runs)
    queues: list[list[RawRecord]] = []
    ids = itertools.count()
    for r in range(runs):
        machine = machines[names[r % len(names)]]
        run = _Life(f"run-{seed}-{r}", machine, keys, ids, seed)
        propose = run.propose
        propose(
            "create", "runtime", payload={"machine": machine.name, "options": {"max_retries": 3}}
        )
        while len(run.records) < length and run.snapshot is not None:
            state = run.snapshot.state
            edges = [e for (src, _), e in machine.edges.items() if src == state]
            if not edges:
                break  # terminal
            if rng.random() < refused:
                mistake = rng.randrange(3)
                if mistake == 0:  # a principal without authority
                    event = rng.choice(edges).event
                    wrong = [
                        k
                        for k, e in keyring.keys.items()
                        if e.authority not in machine.events[event].authorities
                    ]
                    propose(event, rng.choice(sorted(wrong)))
                elif mistake == 1:  # an event this state does not allow
                    illegal = sorted(set(machine.events) - {e.event for e in edges})
                    event = rng.choice(illegal)
                    propose(event, _key_for(machine, event, keyring, rng))
                else:  # a stale revision
                    event = rng.choice(edges).event
                    propose(
                        event,
                        _key_for(machine, event, keyring, rng),
                        expected_revision=max(0, run.snapshot.revision - 1),
                    )
                continue
            if state in machine.step_states and rng.random() < 0.3:
                step = f"step-{len(run.records)}"
                propose(
                    "step_started",
                    "runtime",
                    payload={"step": step, "idempotency_key": f"{run.run_id}:{step}"},
                )
                propose("step_succeeded", "runtime", payload={"step": step, "result": {"ok": True}})
                continue
            # Edges that end the life wait for its last proposal.
            ending = [e for e in edges if not any(s == e.target for (s, _) in machine.edges)]
            going = [e for e in edges if e not in ending]
            late = len(run.records) >= length - 1
            pool = (ending if late else going) or edges
            edge = rng.choice(pool)
            spec = machine.events[edge.event]
            fields: dict[str, object] = {"expected_revision": run.snapshot.revision}
            if edge.reasons:
                fields["reason"] = rng.choice(sorted(edge.reasons))
            if spec.records_fact:
                fields["payload"] = {"fact": rng.choice(["build=green", "build=red"])}
            if spec.approval is not None:  # the decision answers the pause the run is in
                pause = run.snapshot.pause
                fields["payload"] = {
                    "pause": run.snapshot.revision if pause is None else pause.revision,
                    "expires_at_ms": _NEVER_MS,
                }
            propose(edge.event, _key_for(machine, edge.event, keyring, rng), **fields)
        queues.append(run.records)
    out: list[RawRecord] = []
    while queues:
        queue = rng.choice(queues)
        out.append(queue.pop(0))
        if not queue:
            queues.remove(queue)
    return out
