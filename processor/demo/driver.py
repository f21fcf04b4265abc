"""Drive many runs through their stories against a real worker, in waves.

Each wave sends the next proposal of every active run at once, waits until each has
its outcome, then lets every story react. Alongside, hostile records are sent: an
unsigned and a forged proposal, garbage bytes (DLQ) and a resent proposal id.
"""

import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from processor.client import OutcomeWaiter, RunstateClient
from processor.demo.stories import STORIES, Outcome, Step, Story
from processor.kafka.config import KafkaSettings
from processor.kafka.topics import TopicNames
from processor.trust.keyring import SigningKey
from schemas.messages import Proposal, Rejection, Transition


@dataclass
class DemoResult:
    sent: Counter[str] = field(default_factory=Counter)  # proposal id -> records sent
    outcomes: dict[str, list[Outcome]] = field(default_factory=lambda: defaultdict(list))
    garbage_sent: int = 0
    final_state: dict[str, str] = field(default_factory=dict)  # run -> state
    machine_of: dict[str, str] = field(default_factory=dict)
    waves: int = 0

    @property
    def missing(self) -> list[str]:
        return [pid for pid, n in self.sent.items() if len(self.outcomes.get(pid, [])) < n]

    @property
    def extra(self) -> list[str]:
        return [pid for pid, n in self.sent.items() if len(self.outcomes.get(pid, [])) > n]

    def transitions(self) -> list[Transition]:
        return [o for outs in self.outcomes.values() for o in outs if isinstance(o, Transition)]

    def rejections(self) -> list[Rejection]:
        return [o for outs in self.outcomes.values() for o in outs if isinstance(o, Rejection)]


class Driver:
    def __init__(
        self,
        settings: KafkaSettings,
        topics: TopicNames,
        signers: Mapping[str, SigningKey],
        *,
        seed: int = 2026,
        wave_timeout: float = 60.0,
    ) -> None:
        self.rng = random.Random(seed)
        self.signers = signers  # key id -> its signer; the stories sign as theirs
        self.wave_timeout = wave_timeout
        self.result = DemoResult()
        self._cond = threading.Condition()
        self._waiter = OutcomeWaiter(settings, topics, on_outcome=self._record)
        self._client = RunstateClient(settings, topics, signing_key=signers["runtime"])

    def _record(self, outcome: Outcome) -> None:
        with self._cond:
            if outcome.proposal_id is not None:
                self.result.outcomes[outcome.proposal_id].append(outcome)
            if isinstance(outcome, Transition):
                self.result.final_state[outcome.run_id] = outcome.to_state
            self._cond.notify_all()

    def _send(self, run_id: str, step: Step, proposal_id: str | None = None) -> str:
        proposal = Proposal(
            proposal_id=proposal_id or uuid.uuid4().hex,
            run_id=run_id,
            event=step.event,
            payload=step.payload,
            reason=step.reason,
        )
        value = proposal.model_dump_json(exclude_none=True).encode()
        key = run_id.encode()
        headers = self.signers[step.key].headers(
            self._client.topics.proposals, key, value, int(time.time() * 1000)
        )
        self._client.send_raw(key, value, headers)
        self.result.sent[proposal.proposal_id] += 1
        return proposal.proposal_id

    def _hostile(self, run_id: str) -> list[str]:
        """Records no honest producer sends; each must still get exactly one outcome."""
        ids = []
        for kind in ("unsigned", "forged"):
            proposal = Proposal(
                proposal_id=f"{kind}-{uuid.uuid4().hex[:8]}", run_id=run_id, event="start"
            )
            value = proposal.model_dump_json(exclude_none=True).encode()
            forged = SigningKey.hmac("runtime", "f" * 64)
            headers = (
                []
                if kind == "unsigned"
                else forged.headers(
                    self._client.topics.proposals, run_id.encode(), value, int(time.time() * 1000)
                )
            )
            self._client.send_raw(run_id.encode(), value, headers)
            self.result.sent[proposal.proposal_id] += 1
            ids.append(proposal.proposal_id)
        for junk in (b"\xff\xfe not json", b"[]", b'{"half": '):
            self._client.send_raw(f"junk-{uuid.uuid4().hex[:6]}".encode(), junk)
            self.result.garbage_sent += 1
        return ids

    def _wait(self, ids: list[str], progress: Callable[[int], None]) -> None:
        deadline = time.monotonic() + self.wave_timeout
        with self._cond:
            while True:
                done = sum(
                    1
                    for pid in ids
                    if len(self.result.outcomes.get(pid, [])) >= self.result.sent[pid]
                )
                progress(done)
                if done == len(ids) or time.monotonic() > deadline:
                    return
                self._cond.wait(0.2)

    def run(
        self,
        runs: int,
        on_wave: Callable[[int, int], None] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> DemoResult:
        """Drive `runs` runs (a third per machine) until every story has ended."""
        names = sorted(STORIES)
        active: dict[str, tuple[Story, Step]] = {}
        for i in range(runs):
            machine = names[i % len(names)]
            run_id = f"{machine}-{i:04d}-{uuid.uuid4().hex[:6]}"
            story = STORIES[machine](self.rng, run_id)
            active[run_id] = (story, next(story))
            self.result.machine_of[run_id] = machine
        resend: tuple[str, Step, str] | None = None
        while active:
            self.result.waves += 1
            wave: dict[str, str] = {}
            for run_id, (_, step) in active.items():
                wave[run_id] = self._send(run_id, step)
            ids = list(wave.values())
            if self.result.waves == 2:
                ids += self._hostile(next(iter(active)))
            if resend is not None:  # a client that lost its ack sends the same proposal again
                run_id, step, pid = resend
                self._send(run_id, step, proposal_id=pid)
                ids.append(pid)
                resend = None
            self._client.flush()
            if on_wave is not None:
                on_wave(self.result.waves, len(ids))
            self._wait(ids, progress or (lambda _: None))
            for run_id, pid in wave.items():
                story, step = active[run_id]
                outcomes = self.result.outcomes.get(pid)
                if not outcomes:
                    del active[run_id]  # no answer in time: reported as missing
                    continue
                if (
                    self.result.waves == 3
                    and resend is None
                    and isinstance(outcomes[0], Transition)
                ):
                    resend = (run_id, step, pid)
                try:
                    active[run_id] = (story, story.send(outcomes[0]))
                except StopIteration:
                    del active[run_id]
        return self.result

    def close(self) -> None:
        self._client.close()
        self._waiter.close()
