"""What a worker has decided since it started, whichever its runtime: the counts GET
/health shows under "stats", kept by one rule for every kind of outcome."""

import time
from dataclasses import dataclass, field

from processor.engine import Beat, Commit, Forget, Relay
from processor.records.pipeline import DeadLetterReason, Outcome
from processor.records.punctuator import Firing


@dataclass
class OutcomeStats:
    proposals: int = 0  # records decided, whatever their outcome
    transitions: int = 0  # commits, forgetting included
    heartbeats: int = 0
    rejections: int = 0  # a relay's refusal included
    dead_letters: int = 0
    relays: int = 0  # messages sent to other runs (a continuation's)
    deadlines_fired: int = 0
    alerts_raised: int = 0
    started_at: float = field(default_factory=time.time)

    def count(self, outcome: Outcome) -> None:
        """One decided record's outcome."""
        if isinstance(outcome, Commit | Forget):
            self.transitions += 1
        elif isinstance(outcome, Beat):
            self.heartbeats += 1
        elif isinstance(outcome, DeadLetterReason):
            self.dead_letters += 1
        elif isinstance(outcome, Relay):
            self.relays += 1
            self.rejections += outcome.refusal is not None
        else:
            self.rejections += 1
        self.proposals += 1

    def fired(self, firing: Firing) -> None:
        """One timer that fell due: a deadline's proposal, or an alert."""
        if firing.is_deadline:
            self.deadlines_fired += 1
        else:
            self.alerts_raised += 1
