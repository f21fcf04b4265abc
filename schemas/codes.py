"""The typed outcomes of a refused proposal."""

from enum import StrEnum


# The members' order is roughly the order of the checks, not exactly: `unauthorized` is
# checked at several points, the first right after stale_signature (a key's run id
# prefixes); `create` checks unknown_machine and has no unknown_run, other events check
# unknown_run before unknown_machine; limit_exceeded is `create`'s, after run_exists;
# schema_invalid, unknown_machine, revision_conflict, invalid_transition and duplicate
# come again later; heartbeats, checkpoints, steps, `migrate` and `forget` take their
# own paths.
class RejectionCode(StrEnum):
    """Why a proposal was refused. Values are the wire names; docs/wire.md §7 gives the
    order they are checked in."""

    SCHEMA_INVALID = "schema_invalid"
    WRONG_PARTITION = "wrong_partition"
    UNAUTHENTICATED = "unauthenticated"
    STALE_SIGNATURE = "stale_signature"
    UNKNOWN_MACHINE = "unknown_machine"
    UNKNOWN_RUN = "unknown_run"
    RUN_EXISTS = "run_exists"
    DUPLICATE = "duplicate"
    PROPOSAL_ID_REUSED = "proposal_id_reused"
    UNKNOWN_EVENT = "unknown_event"
    UNAUTHORIZED = "unauthorized"
    REVISION_CONFLICT = "revision_conflict"
    LIMIT_EXCEEDED = "limit_exceeded"
    TERMINAL_STATE = "terminal_state"
    INCOMPATIBLE_VERSION = "incompatible_version"
    DEADLINE_PASSED = "deadline_passed"
    INVALID_TRANSITION = "invalid_transition"
    REASON_REQUIRED = "reason_required"
    APPROVAL_WRONG_PAUSE = "approval_wrong_pause"
    APPROVAL_EXPIRED = "approval_expired"
    SELF_APPROVAL = "self_approval"
    GUARD_FAILED = "guard_failed"
    RETRIES_EXHAUSTED = "retries_exhausted"
    DUPLICATE_STEP = "duplicate_step"
    STEP_IN_PROGRESS = "step_in_progress"
    CHECKPOINT_TOO_LARGE = "checkpoint_too_large"
    CONTINUATION_REFUSED = "continuation_refused"
    STATE_TOO_LARGE = "state_too_large"
