"""The contract against a confused or hostile agent.

Any principal holding a valid key, of any scope, sends any event to any run at any
time, with any payload, reuses any proposal id, replays any earlier record (its bytes
and signature as they were, or signed again by the same key) and races the runtime's
own deadlines; over every built-in machine and over generated ones. Each record goes
through `decide_record`, as a worker decides it, and after every one the rules hold,
checked by an oracle that follows the transitions on its own:

- no run reaches success with a step executing, or without the facts its machine calls
  success (a run's creator adds criteria, never waives them), and no executing step is
  started again (nor another beside it, unless the machine declares concurrent steps);
- no run leaves an approval wait, other than to a finished state, without a bound
  approver decision: the pause it answers, unexpired, from an approver who did not ask;
- no deadline is claimed before it falls due: a transition on a deadline's edge (its
  event with its reason; for an approval wait, with any reason the edge allows) comes
  at or after that deadline, armed for the run;
- no proposal id is answered twice in a run's life: committed at most once, and a
  refusal never turns into a commit;
- nothing commits outside the signing key's scope (prefixes on a separator boundary),
  and a refusal to a key outside the run's scope tells nothing of the run;
- a replayed heartbeat moves no deadline;
- a run is continued only as its original agreed: the original was finished, not by an
  approver, and continued by no run before; the continuation carries exactly its
  succeeded steps and checkpoint, and the steps it left executing are executing in the
  continuation (no step of unknown outcome runs again unsettled); both runs name each
  other. Only the workers' key carries the messages between runs; the attacker's relays
  of them are refused.

`make adversary` runs it long (RUNSTATE_ADVERSARY_EXAMPLES) and prints what it tried.
"""

import itertools
import json
import os
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from processor.engine import Beat, Commit, Forget, Machine, Relay, compile_machine, lint
from processor.engine.continuation import CONTINUED_BY, GRANTED, REFUSED, RELAY_EVENTS
from processor.engine.machine import Catalog
from processor.engine.scope import reaches
from processor.history.resume import continuation_payload
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines
from processor.records.pipeline import DeadLetterReason, Outcome, RunsInMemory, decide_record
from processor.records.punctuator import Punctuator
from processor.trust.keyring import Keyring, SigningKey
from schemas import Rejection, RejectionCode
from schemas.machine import MachineSpec
from schemas.messages import Proposal, RunSnapshot, StepStatus, Timer
from tests.examples import examples

pytestmark = pytest.mark.unit

TOPICS = TopicNames.with_prefix()
START_MS = 1_800_000_000_000
EXAMPLES = int(os.environ.get("RUNSTATE_ADVERSARY_EXAMPLES") or examples(300))
STEPS = int(os.environ.get("RUNSTATE_ADVERSARY_STEPS", "80"))

#: Every kind of key an attacker may hold: each authority, scoped by run prefix, by
#: machine, and one person (alice) holding both a runtime and an approver key.
KEYS: dict[str, dict[str, Any]] = {
    "runtime": {"source": "runtime", "authority": "runtime"},
    "runtime-a": {"source": "runtime:a", "authority": "runtime", "run_prefixes": ["team-a"]},
    "runtime-owned": {"source": "runtime:o", "authority": "runtime", "machines": ["owned_run"]},
    "alice-runtime": {"source": "approver:alice", "authority": "runtime"},
    "approver": {"source": "approver:alice", "authority": "approver"},
    "approver-b": {"source": "approver:bob", "authority": "approver", "run_prefixes": ["team-b"]},
    "approver-c": {"source": "approver:carol", "authority": "approver"},
    "tool": {"source": "tool:ci", "authority": "tool_executor"},
    "tool-a": {"source": "tool:a", "authority": "tool_executor", "run_prefixes": ["team-a"]},
    "model": {"source": "model:planner", "authority": "model"},
}
#: The workers' own key: it carries the messages between runs. No attacker holds it.
WORKER = "worker"
_ALL_KEYS = {**KEYS, WORKER: {"source": "worker", "authority": "runtime", "processor": True}}
KEYRING = Keyring.model_validate(
    {"keys": {k: {**v, "secret": f"{k}-secret-" + "x" * 24} for k, v in _ALL_KEYS.items()}}
)
SIGNERS = {k: SigningKey.hmac(k, f"{k}-secret-" + "x" * 24) for k in _ALL_KEYS}
#: Few runs, so that each goes deep: one in team-a's scope, one that only starts like
#: it, one of team-b.
RUN_IDS = ["team-a-1", "team-ab-1", "team-b/1"]
#: Where a built-in run has succeeded.
SUCCESS = {"done", "completed", "ok"}
STEP_NAMES = ["refund", "email"]
FACTS = ["build=green", "build=red"]


def _generated_machine(draw: st.DrawFn) -> MachineSpec | None:
    """A machine with a chain of work states, an approval wait, steps in some states,
    and random extra edges and authorities: the shapes a user may write."""
    authorities = ["runtime", "approver", "tool_executor", "model"]
    n = draw(st.integers(2, 4))
    work = [f"s{i}" for i in range(n)]
    events: dict[str, Any] = {
        "ask": {"authorities": ["runtime"]},
        "grant": {"authorities": ["approver"], "approval": "grant"},
        "deny": {"authorities": ["approver"], "approval": "deny"},
        "finish": {"authorities": draw(st.lists(st.sampled_from(authorities), min_size=1))},
        "abort": {"authorities": ["runtime", "approver"]},
    }
    transitions: list[dict[str, Any]] = []
    for i in range(n - 1):
        name = f"e{i}"
        events[name] = {"authorities": draw(st.lists(st.sampled_from(authorities), min_size=1))}
        transitions.append({"from": work[i], "event": name, "to": work[i + 1]})
    asking = draw(st.sampled_from(work))
    transitions += [
        {"from": asking, "event": "ask", "to": "wait"},
        {"from": "wait", "event": "grant", "to": draw(st.sampled_from(work))},
        {"from": "wait", "event": "deny", "to": "no"},
        {"from": "wait", "event": "abort", "to": "no"},
        {
            "from": work[-1],
            "event": "finish",
            "to": "ok",
            "guards": [{"kind": "steps_settled"}],
        },
    ]
    for state in work:
        if state != asking and draw(st.booleans()):
            transitions.append({"from": state, "event": "abort", "to": "no"})
    spec = {
        "schema_version": 1,
        "name": "generated",
        "states": [*work, "wait", "ok", "no"],
        "initial": work[0],
        "terminal": ["ok", "no"],
        "events": events,
        "transitions": transitions,
        "step_states": draw(st.lists(st.sampled_from(work), min_size=1, unique=True)),
        "concurrent_steps": draw(st.booleans()),
        "create_authorities": ["runtime"],
        "ceilings": {},
        "timeouts": [{"kind": "approval", "state": "wait", "event": "abort", "after_ms": 60_000}],
    }
    machine = MachineSpec.model_validate_json(json.dumps(spec))
    return machine if not lint(machine) else None


@dataclass
class Life:
    """What the oracle knows of one life of a run, from its transitions alone."""

    machine: str
    version: str | None
    state: str
    revision: int
    pause: tuple[int, str] | None = None  # (revision that entered it, who asked)
    executing: set[str] = field(default_factory=set)
    committed: set[str] = field(default_factory=set)
    refused: dict[str, Rejection] = field(default_factory=dict)
    beats_signed: list[int] = field(default_factory=list)
    deadlines: list[Timer] = field(default_factory=list)  # armed by the latest commit or beat
    finished_by: str | None = None  # the authority that finished it
    continued_by: str | None = None


@dataclass(frozen=True)
class Sent:
    run_id: str
    key_id: str  # for a message between runs: the key of the create that caused it
    value: bytes
    headers: Any
    signed_at: int


@dataclass(frozen=True)
class Pending:
    """A message between runs the workers have yet to deliver, caused by `key_id`."""

    proposal: Proposal
    key_id: str


class Adversary(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.machines: Catalog = Catalog(builtin_machines().values())
        self.runs = RunsInMemory()
        self.now = START_MS
        self.lives: dict[str, Life] = {}
        self.sent: list[Sent] = []
        self.ids = itertools.count()
        self.punctuator = Punctuator(TOPICS, SIGNERS[WORKER], KEYRING)
        self.pending: list[Pending] = []
        self.continued: dict[str, str] = {}  # continuation -> the run it continues

    @initialize(spec=st.composite(_generated_machine)())
    def add_generated_machine(self, spec: MachineSpec | None) -> None:
        if spec is not None:
            self.machines["generated"] = compile_machine(spec)

    # -- what the attacker does -------------------------------------------------------
    @rule(
        run_id=st.sampled_from(RUN_IDS),
        key_id=st.sampled_from(sorted(KEYS)),
        machine=st.sampled_from(["task_lifecycle", "owned_run", "run_state", "generated"]),
        options=st.sampled_from(
            [
                {},
                {"max_retries": 1},
                {"max_retries": 10**6},
                {"deadlines": {"approval_timeout_ms": 2**53 - 1}},
                {"success_criteria": []},
            ]
        ),
        carried=st.sampled_from(["no", "no", "honest", "claims a step", "stale", "made up"]),
        original=st.sampled_from(RUN_IDS),
    )
    def create(
        self,
        run_id: str,
        key_id: str,
        machine: str,
        options: dict[str, Any],
        carried: str,
        original: str,
    ) -> None:
        """A run created, or one continuing another: as an honest SDK reads the original
        (`continuation_payload`), or claiming a step the original never finished, naming
        an older revision of it, or carrying a run that never existed."""
        payload: dict[str, Any] = {"machine": machine, "options": options}
        before = self.runs.lookup(original)
        if carried == "made up" or (carried != "no" and before is None):
            payload |= {
                "continues": {"run_id": original, "revision": 3, "hash": "0" * 64},
                "steps": {"refund": {"result": "refunded"}},
            }
        elif carried != "no" and before is not None:
            try:
                payload |= continuation_payload(before, self.machines)
            except ValueError:  # not finished: claim it anyway
                payload |= {
                    "continues": {
                        "run_id": original,
                        "revision": before.revision,
                        "hash": before.last_hash,
                    }
                }
            payload["machine"] = machine
            if carried == "claims a step":
                payload["steps"] = {**payload.get("steps", {}), "refund": {"result": "done"}}
            elif carried == "stale" and before.revision > 0:
                payload["continues"]["revision"] = before.revision - 1
        self._send(run_id, key_id, "create", payload=payload)

    @rule(
        run_id=st.sampled_from(RUN_IDS),
        key_id=st.sampled_from(sorted(KEYS)),
        event=st.sampled_from(
            [
                *{e for m in builtin_machines().values() for e in m.spec.events},
                "ask",
                "grant",
                "deny",
                "finish",
                "abort",
                "e0",
                "e1",
                "e2",
                "step_started",
                "step_succeeded",
                "step_failed",
                "heartbeat",
                "checkpoint",
                "migrate",
                "forget",
                *sorted(RELAY_EVENTS),  # forged messages between runs
            ]
        ),
        data=st.data(),
    )
    def propose(self, run_id: str, key_id: str, event: str, data: st.DataObject) -> None:
        life = self.lives.get(run_id)
        revision = None if life is None else life.revision
        expected = data.draw(
            st.sampled_from([None, revision, None if revision is None else revision - 1, 0, 10**6]),
            label="expected_revision",
        )
        self._send(
            run_id,
            key_id,
            event,
            payload=self._payload(event, life, data),
            expected_revision=expected if expected is None or expected >= 0 else None,
            reason=data.draw(
                st.sampled_from([None, "timeout", "tool_error", "external_callback", "x"])
            ),
            proposal_id=self._proposal_id(run_id, data),
        )

    @rule(run_id=st.sampled_from(RUN_IDS), data=st.data())
    def move_on(self, run_id: str, data: st.DataObject) -> None:
        """A step an honest principal would take (so that runs reach waits, steps and
        their ends, where the attacks matter): an edge from the run's state, or a step
        event, by a key allowed to send it, with the payload it needs."""
        life = self.lives.get(run_id)
        if life is None:
            machine = data.draw(st.sampled_from(sorted(self.machines)), label="machine")
            self._send(run_id, "runtime", "create", payload={"machine": machine})
            return
        machine = self._machine(life.machine, life.version)
        moves = [e for (state, _), e in machine.edges.items() if state == life.state]
        if life.state in machine.step_states:
            moves += ["step_started", "step_succeeded", "step_failed"]  # type: ignore[list-item]
        if not moves:
            return
        asking = [
            m for m in moves if not isinstance(m, str) and m.target in machine.approval_states
        ]
        if asking and data.draw(st.booleans(), label="towards an approval"):
            moves = asking  # (where most of the rules are tried)
        move = data.draw(st.sampled_from(moves), label="move")
        event = move if isinstance(move, str) else move.event
        spec = machine.events.get(event)
        allowed = spec.authorities if spec is not None else machine.spec.step_authorities
        keys = [k for k, v in sorted(KEYS.items()) if v["authority"] in allowed]
        if not keys:
            return
        key_id = data.draw(st.sampled_from(keys), label="key")
        payload = self._payload(event, life, data)
        if spec is not None and spec.approval is not None and life.pause is not None:
            payload = {"pause": life.pause[0], "expires_at_ms": self.now + 60_000}
        reasons = [] if isinstance(move, str) else sorted(move.reasons)
        reason = data.draw(st.sampled_from(reasons)) if reasons else None
        self._send(
            run_id, key_id, event, payload=payload, reason=reason, expected_revision=life.revision
        )

    @rule(run_id=st.sampled_from(RUN_IDS), key_id=st.sampled_from(sorted(KEYS)), data=st.data())
    def attack(self, run_id: str, key_id: str, data: st.DataObject) -> None:
        """Aimed where the rules matter: a run waiting for an approval gets a decision of
        another pause, an expired one, one by the asker, or any other event that leaves
        the wait; a run with a step executing gets it started again, another step
        started, or its success proposed; any other run, its success proposed."""
        life = self.lives.get(run_id)
        if life is None:
            return
        machine = self._machine(life.machine, life.version)
        events = sorted({e for (state, e) in machine.edges if state == life.state})
        if life.state in machine.approval_states:
            decisions = sorted(e for e in events if machine.events[e].approval is not None)
            pause = life.revision if life.pause is None else life.pause[0]
            event = data.draw(st.sampled_from(decisions + events), label="event")
            payload = {
                "pause": data.draw(st.sampled_from([pause, pause - 1, pause + 1, 0])),
                "expires_at_ms": self.now + data.draw(st.sampled_from([-1, 0, 60_000])),
            }
            spec = machine.events[event]
            deciders = [k for k, v in sorted(KEYS.items()) if v["authority"] in spec.authorities]
            who = data.draw(st.sampled_from(["asker", "allowed", "anyone"]), label="by")
            if who == "asker" and life.pause is not None:
                key_id = next(
                    (k for k, v in sorted(KEYS.items()) if v["source"] == life.pause[1]), key_id
                )
            elif who == "allowed" and deciders:
                key_id = data.draw(st.sampled_from(deciders))
            reasons = sorted({t.reason for t in machine.spec.timeouts if t.reason is not None})
            reason = data.draw(st.sampled_from([None, *reasons]), label="reason")
            self._send(
                run_id,
                key_id,
                event,
                payload=payload,
                reason=reason,
                expected_revision=life.revision,
            )
            return
        if life.executing:
            step = data.draw(st.sampled_from(sorted(life.executing)), label="step")
            other = data.draw(st.sampled_from(STEP_NAMES), label="other step")
            choice = data.draw(st.sampled_from(["again", "other", "finish"]), label="attack")
            if choice == "finish":
                ends = [e for e in events if (life.state, e) in machine.edges]
                if ends:
                    self._send(run_id, key_id, data.draw(st.sampled_from(ends)))
                return
            key = data.draw(st.sampled_from(["k1", "k2", "k3"]), label="idempotency key")
            named = step if choice == "again" else other
            payload = {"step": named, "idempotency_key": key}
            self._send(run_id, key_id, "step_started", payload=payload)
            return
        # success proposed at once, by a key allowed to: facts or no facts
        for (state, event), edge in sorted(machine.edges.items()):
            if state == life.state and edge.target in SUCCESS:
                authorities = machine.events[event].authorities
                allowed = [k for k, v in sorted(KEYS.items()) if v["authority"] in authorities]
                self._send(run_id, allowed[0] if allowed else key_id, event)
                return

    @rule(index=st.integers(0, 10_000), data=st.data())
    def resend_a_refused_one(self, index: int, data: st.DataObject) -> None:
        """A proposal refused before (wrong state, stale revision, ...), sent again by
        its key once the run has moved on: answered means answered."""
        refused = [
            s
            for s in self.sent
            if (life := self.lives.get(s.run_id)) is not None
            and json.loads(s.value)["proposal_id"] in life.refused
        ]
        if not refused:
            return
        old = refused[index % len(refused)]
        headers = SIGNERS[old.key_id].headers(
            TOPICS.proposals, old.run_id.encode(), old.value, self.now
        )
        self._decide(Sent(old.run_id, old.key_id, old.value, headers, self.now))

    @rule(index=st.integers(0, 10_000), again=st.booleans(), key_id=st.sampled_from(sorted(KEYS)))
    def replay(self, index: int, again: bool, key_id: str) -> None:
        """An earlier record once more: as it was (its signature of then), or signed now
        by the key that sent it (an agent holding the key) or by another key."""
        if not self.sent:
            return
        old = self.sent[index % len(self.sent)]
        if not again:
            self._decide(old)
            return
        signer = SIGNERS[key_id]
        headers = signer.headers(TOPICS.proposals, old.run_id.encode(), old.value, self.now)
        self._decide(Sent(old.run_id, key_id, old.value, headers, self.now))

    @rule(key_id=st.sampled_from(sorted(KEYS)), data=st.data())
    def continue_a_finished_run(self, key_id: str, data: st.DataObject) -> None:
        """Where the continuation rules matter: a finished run continued as a free run
        id, honestly or not, the workers delivering the messages at once or later."""
        finished = [
            r
            for r, life in sorted(self.lives.items())
            if life.state in self._machine(life.machine, life.version).terminal
        ]
        free = [r for r in RUN_IDS if r not in self.lives]
        if not finished and self.lives:  # finish one first, the shortest way
            run_id = data.draw(st.sampled_from(sorted(self.lives)), label="to finish")
            if data.draw(st.booleans(), label="a step left executing"):
                self._start_a_step(run_id, data)
            self._finish(run_id)
            life = self.lives.get(run_id)
            if (
                life is not None
                and life.state in self._machine(life.machine, life.version).terminal
            ):
                finished = [run_id]
        if not finished or not free:
            return
        original = data.draw(st.sampled_from(finished), label="original")
        before = self.runs.lookup(original)
        assert before is not None
        payload = continuation_payload(before, self.machines)
        tamper = data.draw(
            st.sampled_from(["none", "none", "step", "hide", "checkpoint", "stale"]),
            label="tamper",
        )
        if tamper == "step":
            payload["steps"] = {**payload["steps"], "refund": {"result": "done"}}
        elif tamper == "hide":  # the steps left executing, to run them again afresh
            payload["steps"] = {n: s for n, s in payload["steps"].items() if "status" not in s}
        elif tamper == "checkpoint":
            payload["checkpoint"] = {"n": 2}
        elif tamper == "stale" and before.revision > 0:
            payload["continues"]["revision"] = before.revision - 1
        self._send(
            data.draw(st.sampled_from(free), label="new run"), key_id, "create", payload=payload
        )
        while self.pending and data.draw(st.booleans(), label="delivered at once"):
            self.workers_deliver(0)

    @rule(index=st.integers(0, 10_000))
    def workers_deliver(self, index: int) -> None:
        """A message between runs arrives, in any order against everything else (a
        continuation's ask at its original, the answer at the new run)."""
        if not self.pending:
            return
        sent = self.pending.pop(index % len(self.pending))
        record = self.punctuator.relay(sent.proposal, self.now, 1)
        assert record.value is not None
        run_id = sent.proposal.run_id
        self._decide(Sent(run_id, sent.key_id, record.value, record.headers, self.now))

    @rule(ms=st.sampled_from([1, 500, 30_000, 120_000, 3_600_000]))
    def wait(self, ms: int) -> None:
        self.now += ms

    @rule()
    def runtime_fires_its_deadlines(self) -> None:
        """The runtime's own deadlines race the agents, as the punctuator sends them."""
        for run_id in RUN_IDS:
            snapshot = self.runs.lookup(run_id)
            if snapshot is None:
                continue
            for timer in snapshot.timers:
                if timer.kind == "deadline" and timer.due_at_ms <= self.now:
                    record = self.punctuator.deadline(snapshot, timer, self.now)
                    assert record.value is not None
                    self._decide(Sent(run_id, "runtime", record.value, record.headers, self.now))

    # -- helpers ---------------------------------------------------------------------
    def _payload(self, event: str, life: Life | None, data: st.DataObject) -> dict[str, Any]:
        if event in (
            "approval_granted",
            "approval_denied",
            "approved",
            "rejected",
            "grant",
            "deny",
        ):
            pauses = [0, 1, 2, 3]
            if life is not None:
                pauses += [life.revision, life.revision - 1]
                if life.pause is not None:
                    pauses.append(life.pause[0])
            return {
                "pause": data.draw(st.sampled_from(pauses), label="pause"),
                "expires_at_ms": self.now + data.draw(st.sampled_from([-1, 0, 1, 60_000])),
            }
        if event == "tool_result":
            return {"fact": data.draw(st.sampled_from(FACTS)), "call_id": "c1"}
        step = data.draw(st.sampled_from(STEP_NAMES), label="step")
        if event == "step_started":
            return {"step": step, "idempotency_key": data.draw(st.sampled_from(["k1", "k2"]))}
        if event == "step_succeeded":
            return {"step": step, "result": {"ok": True}}
        if event == "step_failed":
            return {"step": step, "error": "outcome unknown"}
        if event == "checkpoint":
            return {"data": {"n": 1}}
        if event == "migrate":
            return {"version": data.draw(st.sampled_from(["0" * 16, "x"]))}
        if event == CONTINUED_BY:  # as if a run asked, carrying what it claims
            return {
                "run_id": data.draw(st.sampled_from(RUN_IDS)),
                "proposal_id": "p-forged",
                "principal": {"source": "runtime", "authority": "runtime"},
                "revision": 0 if life is None else life.revision,
                "hash": "0" * 64,
                "steps_digest": "0" * 64,
                "checkpoint_digest": "0" * 64,
            }
        if event in (GRANTED, REFUSED):  # the original's answer, made up
            return {
                "create": {
                    "proposal_id": "p-forged",
                    "run_id": data.draw(st.sampled_from(RUN_IDS)),
                    "event": "create",
                    "payload": {
                        "machine": "task_lifecycle",
                        "continues": {"run_id": "team-b/1", "revision": 3, "hash": "0" * 64},
                        "steps": {"refund": {"result": "refunded"}},
                    },
                },
                "principal": {"source": "runtime", "authority": "runtime"},
            }
        return {}

    def _proposal_id(self, run_id: str, data: st.DataObject) -> str:
        earlier = [json.loads(s.value)["proposal_id"] for s in self.sent]
        choice = data.draw(st.sampled_from(["fresh", "fresh", "reuse", "timer"]), label="id")
        if choice == "reuse" and earlier:
            return data.draw(st.sampled_from(earlier), label="reused id")
        if choice == "timer":
            return f"timer:{run_id}:1:approval"
        return f"p{next(self.ids)}"

    def _send(self, run_id: str, key_id: str, event: str, **fields: Any) -> None:
        body = {"run_id": run_id, "event": event, **fields}
        body.setdefault("proposal_id", f"p{next(self.ids)}")
        value = json.dumps({k: v for k, v in body.items() if v is not None}).encode()
        headers = SIGNERS[key_id].headers(TOPICS.proposals, run_id.encode(), value, self.now)
        sent = Sent(run_id, key_id, value, headers, self.now)
        self.sent.append(sent)
        self._decide(sent)

    def _decide(self, sent: Sent) -> None:
        before = self.runs.lookup(sent.run_id)
        outcome = decide_record(
            sent.run_id.encode(),
            sent.value,
            sent.headers,
            self.now,
            topic=TOPICS.proposals,
            keyring=KEYRING,
            machines=self.machines,
            lookup=self.runs.lookup,
            seen=self.runs.seen,
            placement=None,
        )
        self.now += 1
        hypothesis.event(_kind(outcome))
        self._check(sent, before is not None, outcome)
        self.runs.apply(outcome)

    # -- the rules, checked on every outcome -----------------------------------------
    def _check(self, sent: Sent, existed: bool, outcome: Outcome) -> None:
        key = KEYS[sent.key_id]
        life = self.lives.get(sent.run_id)
        proposal_id = json.loads(sent.value)["proposal_id"]
        body = json.loads(sent.value)
        created = body.get("payload", {})
        if body["event"] in (GRANTED, REFUSED) and isinstance(created.get("create"), dict):
            created = created["create"].get("payload", {})  # the create it answers
        machine_name = life.machine if life is not None else created.get("machine")
        prefixes = key.get("run_prefixes")
        in_scope = (prefixes is None or any(reaches(p, sent.run_id) for p in prefixes)) and (
            "machines" not in key or machine_name in key["machines"]
        )
        if isinstance(outcome, Relay):
            self.pending.append(Pending(outcome.proposal, sent.key_id))
            if outcome.refusal is None:
                return
            outcome = outcome.refusal  # the create's own outcome, decided here
        if isinstance(outcome, Commit):
            self.pending += [Pending(p, sent.key_id) for p in outcome.sends]
        if isinstance(outcome, Rejection):
            if not in_scope:
                assert outcome.state is None and outcome.revision is None, outcome
            if life is None or not existed or outcome.code in _BEFORE_THE_RUNS_MEMORY:
                return
            first = life.refused.get(proposal_id)
            if first is not None:
                assert outcome.code in (RejectionCode.PROPOSAL_ID_REUSED, first.code), outcome
            elif proposal_id not in life.committed and outcome.code not in _ABOUT_AN_ANSWER:
                # A first answer: the run remembers it for its life.
                assert outcome.content_digest is not None, f"not remembered: {outcome}"
                life.refused[proposal_id] = outcome
            return
        if isinstance(outcome, DeadLetterReason):
            return
        if isinstance(outcome, Forget):
            del self.lives[sent.run_id]
            return
        assert in_scope, f"{sent.key_id} acted on {sent.run_id} outside its scope: {outcome}"
        if isinstance(outcome, Beat):
            assert life is not None
            assert all(sent.signed_at > s for s in life.beats_signed), (
                "a heartbeat signed no later than one taken moved the deadline"
            )
            life.beats_signed.append(sent.signed_at)
            life.deadlines = outcome.snapshot.timers
            return
        assert isinstance(outcome, Commit)
        t, snapshot = outcome.transition, outcome.snapshot
        if t.from_state is None:  # a new life
            assert life is None
            machine = self._machine(snapshot.machine, snapshot.machine_version)
            life = Life(snapshot.machine, snapshot.machine_version, t.to_state, 0)
            life.executing = {
                n for n, s in snapshot.steps.items() if s.status is StepStatus.EXECUTING
            }
            if "continues" in t.payload:
                self._check_continuation(t.run_id, t.payload, life.executing)
            else:
                assert not life.executing, f"a new run with steps executing: {life.executing}"
            life.deadlines = snapshot.timers
            self.lives[sent.run_id] = life
            life.committed.add(t.proposal_id)
            return
        assert life is not None and t.revision == life.revision + 1
        assert t.proposal_id not in life.committed, f"{t.proposal_id} committed twice"
        assert t.proposal_id not in life.refused, f"{t.proposal_id} refused, then committed"
        life.committed.add(t.proposal_id)
        machine = self._machine(life.machine, snapshot.machine_version)
        waits = machine.approval_states
        if t.from_state in waits and t.to_state != t.from_state:
            spec = machine.events.get(t.event)
            if t.to_state not in machine.terminal:
                assert spec is not None and spec.approval is not None, (
                    f"'{t.event}' moved a run out of approval wait {t.from_state} to {t.to_state}"
                )
                assert life.pause is not None
                assert t.payload.get("pause") == life.pause[0], "a decision of another pause"
                assert t.payload["expires_at_ms"] > t.at_ms, "an expired decision"
                assert t.principal.source != life.pause[1], "the asker approved itself"
                assert t.principal.authority in spec.authorities
        claimed = _claimed_deadlines(machine, t.from_state, t.event, t.reason)
        if claimed:
            assert any(
                d.kind == "deadline" and d.name in claimed and d.due_at_ms <= t.at_ms
                for d in life.deadlines
            ), f"'{t.event}' from {t.from_state} claimed its {claimed} deadline before it fell due"
        if t.event == "step_started":
            step = t.payload["step"]
            assert step not in life.executing, f"step {step} started while executing"
            assert machine.spec.concurrent_steps or not life.executing, (
                f"step {step} started beside {life.executing}"
            )
            life.executing.add(step)
        elif t.event in ("step_succeeded", "step_failed"):
            life.executing.discard(t.payload["step"])
        if t.event == CONTINUED_BY:  # the original takes a continuation
            assert t.principal.source == "worker", "a message between runs from an agent"
            assert t.to_state == t.from_state and t.to_state in machine.terminal, (
                f"a run continued in {t.from_state}, not finished"
            )
            assert life.continued_by is None, f"continued twice: by {life.continued_by}"
            assert life.finished_by not in machine.approval_authorities, (
                "a run an approver ended was continued"
            )
            life.continued_by = t.payload["run_id"]
        if t.event == "continuation_undone":
            assert t.principal.source == "worker", "a message between runs from an agent"
            assert life.continued_by == t.payload["run_id"]
            assert self.continued.get(life.continued_by) != sent.run_id, "undid a continuation"
            life.continued_by = None
        if t.to_state in SUCCESS:
            assert not life.executing, f"{t.to_state} with steps executing: {life.executing}"
            unmet = set(machine.spec.default_success_criteria) - set(snapshot.facts)
            assert not unmet, f"{t.to_state} without its machine's success criteria {unmet}"
        if t.to_state in machine.terminal and t.from_state != t.to_state:
            life.finished_by = t.principal.authority
        if t.to_state in waits and t.from_state != t.to_state:
            life.pause = (t.revision, t.principal.source)
        elif t.to_state not in waits:
            life.pause = None
        life.state, life.revision, life.version = t.to_state, t.revision, t.machine_version
        life.deadlines = snapshot.timers

    def _finish(self, run_id: str) -> None:
        """Drive a run to a finished state by the shortest way, each edge sent by the
        first key allowed to (an approval as a bound decision)."""
        for _ in range(8):
            life = self.lives.get(run_id)
            if life is None:
                return
            machine = self._machine(life.machine, life.version)
            path = _shortest_to_an_end(machine, life.state)
            if not path:
                return
            event = path[0]
            spec = machine.events[event]
            keys = [
                k
                for k, v in sorted(KEYS.items())
                if v["authority"] in spec.authorities
                and (life.pause is None or v["source"] != life.pause[1])
            ]
            if not keys:
                return
            payload: dict[str, Any] = {}
            if spec.approval is not None and life.pause is not None:
                payload = {"pause": life.pause[0], "expires_at_ms": self.now + 60_000}
            edge = machine.edges[(life.state, event)]
            reason = min(edge.reasons) if edge.reasons else None
            self._send(
                run_id,
                keys[0],
                event,
                payload=payload,
                reason=reason,
                expected_revision=life.revision,
            )

    def _start_a_step(self, run_id: str, data: st.DataObject) -> None:
        """A step started on the run, by the first key allowed to, where steps run."""
        life = self.lives.get(run_id)
        if life is None:
            return
        machine = self._machine(life.machine, life.version)
        keys = [k for k, v in sorted(KEYS.items()) if v["authority"] in machine.step_authorities]
        if life.state in machine.step_states and keys:
            step = data.draw(st.sampled_from(STEP_NAMES), label="step")
            payload = {"step": step, "idempotency_key": f"{step}-1"}
            self._send(run_id, keys[0], "step_started", payload=payload)

    def _check_continuation(
        self, run_id: str, payload: dict[str, Any], executing: set[str]
    ) -> None:
        """A continuation committed: its original took it first, naming it, and it
        carries exactly the original's succeeded steps and checkpoint, and starts with
        the steps the original left executing still `executing`: their outcome is
        unknown, and none runs again until it is settled."""
        link = payload["continues"]
        original = self.lives.get(link["run_id"])
        assert original is not None, f"{run_id} continues a run that is not there"
        assert original.continued_by == run_id, (
            f"{run_id} continues {link['run_id']}, which names {original.continued_by}"
        )
        before: RunSnapshot | None = self.runs.lookup(link["run_id"])
        assert before is not None
        succeeded = {
            n: (s.idempotency_key, s.attempts, s.result)
            for n, s in before.steps.items()
            if s.status is StepStatus.SUCCEEDED
        }
        carried = {
            n: (s.get("idempotency_key"), s.get("attempts", 1), s.get("result"))
            for n, s in payload.get("steps", {}).items()
            if s.get("status", "succeeded") == "succeeded"
        }
        assert carried == succeeded, f"{run_id} carries {carried}, the original had {succeeded}"
        assert executing == original.executing, (
            f"{run_id} starts with {executing} executing; the original left "
            f"{original.executing} of unknown outcome"
        )
        assert payload.get("checkpoint", {}) == before.checkpoint
        self.continued[run_id] = link["run_id"]

    def _machine(self, name: str, version: str | None) -> Machine:
        machine = self.machines.get(name)
        assert machine is not None
        return machine

    @invariant()
    def an_original_names_only_its_continuation(self) -> None:
        """Once the workers delivered every message, a run that names a continuation is
        the one that continuation continues."""
        if self.pending:
            return
        for run_id, life in self.lives.items():
            if life.continued_by is not None:
                assert self.continued.get(life.continued_by) == run_id, (
                    f"{run_id} names {life.continued_by}, which does not continue it"
                )

    @invariant()
    def the_engine_agrees_with_the_oracle(self) -> None:
        for run_id, life in self.lives.items():
            snapshot = self.runs.lookup(run_id)
            assert snapshot is not None and snapshot.revision == life.revision
            executing = {n for n, s in snapshot.steps.items() if s.status is StepStatus.EXECUTING}
            assert executing == life.executing


def _claimed_deadlines(
    machine: Machine, state: str | None, event: str, reason: str | None
) -> set[str]:
    """The deadlines a transition from `state` on `event` with `reason` claims: those
    the machine arms in `state` to propose `event`, named by their reason; an approval
    wait's, whatever reason the edge allows (the wait is left by a decision or by its
    deadline)."""
    edge = machine.edges.get((state or "", event))
    if edge is None:
        return set()
    return {
        t.kind
        for t in machine.spec.timeouts
        if (t.state, t.event) == (state, event)
        and (
            (t.reason is not None and t.reason == reason)
            or (t.kind == "approval" and edge.reasons <= {t.reason})
        )
    }


def _shortest_to_an_end(machine: Machine, state: str) -> list[str]:
    """The events of a shortest way from `state` to a finished state (none: none)."""
    ways: dict[str, list[str]] = {state: []}
    frontier = [state]
    while frontier:
        nxt = []
        for at in frontier:
            if at in machine.terminal:
                return ways[at]
            for (source, event), edge in sorted(machine.edges.items()):
                if source == at and edge.target not in ways and not edge.guards:
                    ways[edge.target] = [*ways[at], event]
                    nxt.append(edge.target)
        frontier = nxt
    return []


#: Refusals made before a run's memory of answers is read: of a record not proven to
#: come from a key holder, out of the key's scope, with a deadline's id, or of a run this
#: worker cannot decide.
_BEFORE_THE_RUNS_MEMORY = {
    RejectionCode.SCHEMA_INVALID,
    RejectionCode.WRONG_PARTITION,
    RejectionCode.UNAUTHENTICATED,
    RejectionCode.STALE_SIGNATURE,
    RejectionCode.UNAUTHORIZED,
    RejectionCode.UNKNOWN_MACHINE,
}


#: Refusals that are no first answer: about an earlier one, or of a create of a run
#: that is there already.
_ABOUT_AN_ANSWER = {
    RejectionCode.DUPLICATE,
    RejectionCode.PROPOSAL_ID_REUSED,
    RejectionCode.RUN_EXISTS,
}


def _kind(outcome: Outcome) -> str:
    if isinstance(outcome, Rejection):
        return f"refused {outcome.code.value}"
    if isinstance(outcome, Commit):
        return f"committed {outcome.transition.event}"
    return type(outcome).__name__


Adversary.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_the_contract_holds_against_any_key_holder = Adversary.TestCase


@hypothesis.given(
    machine=st.sampled_from(sorted(builtin_machines())),
    criteria=st.none() | st.lists(st.sampled_from([*FACTS, "tests=pass"]), max_size=3),
    key_id=st.sampled_from(sorted(KEYS)),
)
def test_no_creator_waives_what_its_machine_calls_success(
    machine: str, criteria: list[str] | None, key_id: str
) -> None:
    """Whoever creates a run, with whatever success criteria: a run created holds its
    machine's own among them, so it cannot succeed without the facts its machine calls
    success (the oracle above holds every success to them)."""
    options = {} if criteria is None else {"success_criteria": criteria}
    body = {"run_id": "team-a-1", "proposal_id": "p", "event": "create"}
    value = json.dumps({**body, "payload": {"machine": machine, "options": options}}).encode()
    outcome = decide_record(
        b"team-a-1",
        value,
        SIGNERS[key_id].headers(TOPICS.proposals, b"team-a-1", value, START_MS),
        START_MS,
        topic=TOPICS.proposals,
        keyring=KEYRING,
        machines=builtin_machines(),
        lookup=lambda _: None,
        seen=lambda _run, _proposal: None,
        placement=None,
    )
    if isinstance(outcome, Commit):
        own = builtin_machines()[machine].spec.default_success_criteria
        assert set(own) <= set(outcome.snapshot.success_criteria), outcome.snapshot
