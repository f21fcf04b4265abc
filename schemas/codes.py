"""The typed outcomes of a refused proposal, in the order the engine checks them."""

from enum import StrEnum


class RejectionCode(StrEnum):
    """Why a proposal was refused. Values are the wire names; order is check order."""

    SCHEMA_INVALID = "schema_invalid"
    WRONG_PARTITION = "wrong_partition"
    UNAUTHENTICATED = "unauthenticated"
    STALE_SIGNATURE = "stale_signature"
    UNKNOWN_MACHINE = "unknown_machine"
    UNKNOWN_RUN = "unknown_run"
    RUN_EXISTS = "run_exists"
    DUPLICATE = "duplicate"
    UNKNOWN_EVENT = "unknown_event"
    UNAUTHORIZED = "unauthorized"
    REVISION_CONFLICT = "revision_conflict"
    TERMINAL_STATE = "terminal_state"
    INCOMPATIBLE_VERSION = "incompatible_version"
    DEADLINE_PASSED = "deadline_passed"
    INVALID_TRANSITION = "invalid_transition"
    REASON_REQUIRED = "reason_required"
    GUARD_FAILED = "guard_failed"
    RETRIES_EXHAUSTED = "retries_exhausted"
    DUPLICATE_STEP = "duplicate_step"
    CHECKPOINT_TOO_LARGE = "checkpoint_too_large"
    STATE_TOO_LARGE = "state_too_large"
