"""The decision engine: machines as data and `decide`. Pure: no I/O, no clock."""

from processor.engine.decide import (
    Beat,
    Commit,
    Decision,
    Forget,
    Relay,
    alive_at,
    decide,
    transition_id,
)
from processor.engine.lint import CREATE_EVENT, STEP_EVENTS, LintIssue, lint
from processor.engine.machine import Machine, MachineInvalid, compile_machine, is_finished
from processor.engine.scope import Scope

__all__ = [
    "CREATE_EVENT",
    "STEP_EVENTS",
    "Beat",
    "Commit",
    "Decision",
    "Forget",
    "LintIssue",
    "Machine",
    "MachineInvalid",
    "Relay",
    "Scope",
    "alive_at",
    "compile_machine",
    "decide",
    "is_finished",
    "lint",
    "transition_id",
]
