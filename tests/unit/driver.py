"""Drive one run through `decide` the way the runtime will: snapshot in, decision out."""

from collections.abc import Mapping
from typing import Any

from processor.engine import Beat, Commit, Decision, Machine, Relay, decide
from processor.engine.answers import Answer, committed_digest
from processor.engine.scope import Scope
from processor.machines import builtin_machines
from schemas import Principal, Proposal, Rejection, RunSnapshot, Transition

RUNTIME = Principal(source="runtime", authority="runtime")
TOOL = Principal(source="tool:get_status", authority="tool_executor")
MODEL = Principal(source="model:planner", authority="model")
APPROVER = Principal(source="approver:alice", authority="approver")
#: The scope of an operator's key (keyring "operator": true): what `migrate` takes.
OPERATOR = Scope("operator", operator=True)
#: The workers' own key (keyring "processor": true): it carries messages between runs.
WORKER = Principal(source="worker", authority="runtime")
PROCESSOR = Scope("worker", processor=True)
#: The latest driver of each run id: where the messages between runs are delivered.
RUNS: dict[str, "Driver"] = {}


class Driver:
    def __init__(
        self,
        machines: Mapping[str, Machine] | None = None,
        run_id: str = "run-7",
        tick_ms: int = 1_000,
    ):
        self.machines = builtin_machines() if machines is None else machines
        self.run_id = run_id
        self.tick_ms = tick_ms  # broker time between two proposals
        self.snapshot: RunSnapshot | None = None
        self.history: list[Transition] = []
        self.answers: dict[str, Answer] = {}  # every proposal id answered, for the run's life
        self.now = 1_700_000_000_000
        self._n = 0
        RUNS[run_id] = self

    def propose(
        self,
        event: str,
        principal: Principal = RUNTIME,
        *,
        payload: dict[str, Any] | None = None,
        reason: str | None = None,
        expected_revision: int | None = None,
        proposal_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        scope: Scope | None = None,
    ) -> Decision:
        self._n += 1
        proposal = Proposal(
            proposal_id=proposal_id or f"p{self._n}",
            run_id=self.run_id,
            event=event,
            reason=reason,
            expected_revision=expected_revision,
            payload=payload or {},
            metadata=metadata or {},
        )
        decision = self._decide(proposal, principal, scope)
        # The messages between runs, delivered at once, as the workers do: the decision
        # returned is the proposal's own, at the end of the round trip.
        while isinstance(decision, Relay) or (isinstance(decision, Commit) and decision.sends):
            sent = decision.proposal if isinstance(decision, Relay) else decision.sends[0]
            target = RUNS.get(sent.run_id) or Driver(self.machines, sent.run_id)
            target.now = max(target.now, self.now)
            decision = target._decide(sent, WORKER, PROCESSOR)
        return decision

    def _decide(self, proposal: Proposal, principal: Principal, scope: Scope | None) -> Decision:
        decision = decide(
            self.machines, self.snapshot, proposal, principal, self.now, self.answers.get, scope
        )
        self.now += self.tick_ms
        if isinstance(decision, Commit | Beat):
            self.snapshot = decision.snapshot
        if isinstance(decision, Commit):
            t = decision.transition
            self.history.append(t)
            # The id the transition committed (a granted continuation commits its create's)
            self.answers[t.proposal_id] = Answer(t.revision, committed_digest(t))
        elif isinstance(decision, Rejection) and decision.content_digest is not None:
            self.answers[decision.proposal_id or ""] = Answer(
                None, decision.content_digest, decision
            )
        return decision

    @property
    def committed(self) -> dict[str, int]:
        """Every proposal id the run committed, with its revision."""
        return {p: a.revision for p, a in self.answers.items() if a.revision is not None}

    def decision(self, expires_in_ms: int = 3_600_000, pause: int | None = None) -> dict[str, Any]:
        """An approver's decision payload for the pause the run is in (or `pause`)."""
        assert self.snapshot is not None
        if pause is None:
            pause = (
                self.snapshot.revision
                if self.snapshot.pause is None
                else self.snapshot.pause.revision
            )
        return {"pause": pause, "expires_at_ms": self.now + expires_in_ms}

    def commit(self, event: str, principal: Principal = RUNTIME, **kw: Any) -> Commit:
        decision = self.propose(event, principal, **kw)
        assert isinstance(decision, Commit), f"{event} refused: {decision}"
        return decision

    def beat(self, principal: Principal = RUNTIME, **kw: Any) -> Beat:
        decision = self.propose("heartbeat", principal, **kw)
        assert isinstance(decision, Beat), f"heartbeat not taken: {decision}"
        return decision

    def refuse(self, event: str, principal: Principal = RUNTIME, **kw: Any) -> Rejection:
        decision = self.propose(event, principal, **kw)
        assert isinstance(decision, Rejection), f"{event} was committed: {decision}"
        return decision

    def create(self, machine: str, principal: Principal = RUNTIME, **options: Any) -> Commit:
        return self.commit("create", principal, payload={"machine": machine, "options": options})

    @property
    def state(self) -> str:
        assert self.snapshot is not None
        return self.snapshot.state
