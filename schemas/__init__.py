"""Wire contracts of runstate (pydantic v2). JSON Schema copies live in `schemas/json/`."""

from schemas.base import SCHEMA_VERSION
from schemas.codes import RejectionCode
from schemas.machine import EventSpec, Guard, GuardKind, MachineSpec, RetryPolicy, TransitionSpec
from schemas.messages import (
    CarriedStep,
    CheckpointPayload,
    CreatePayload,
    DeadLetter,
    Deadlines,
    FactPayload,
    Principal,
    Proposal,
    Rejection,
    RunLink,
    RunOptions,
    RunSnapshot,
    StepFailedPayload,
    StepRecord,
    StepStartedPayload,
    StepStatus,
    StepSucceededPayload,
    Transition,
)

__all__ = [
    "SCHEMA_VERSION",
    "CarriedStep",
    "CheckpointPayload",
    "CreatePayload",
    "DeadLetter",
    "Deadlines",
    "EventSpec",
    "FactPayload",
    "Guard",
    "GuardKind",
    "MachineSpec",
    "Principal",
    "Proposal",
    "Rejection",
    "RejectionCode",
    "RetryPolicy",
    "RunLink",
    "RunOptions",
    "RunSnapshot",
    "StepFailedPayload",
    "StepRecord",
    "StepStartedPayload",
    "StepStatus",
    "StepSucceededPayload",
    "Transition",
    "TransitionSpec",
]
