"""Which timers a run arms after a commit: deadlines (a proposal the processor will
send) and alerts (a run too long in a state). Pure: due times derive from the commit's broker time,
and the retry jitter from the run id and revision, so a replay arms the same timers.
"""

import hashlib

from processor.engine.machine import Machine
from schemas.identifiers import MAX_PROPOSAL_ID_BYTES
from schemas.messages import Deadlines, Timer

RETRY_REASON = "retry_backoff"
#: The alert rule of an approval deadline's reminder (a timeout's `remind_before_ms`).
APPROVAL_REMINDER = "approval_reminder"
RETENTION = "retention"  # the timer, and the reason of the `forget` it proposes
#: Deadlines that expire (a proposal after them is decided after them); named after the
#: timeout kinds of machine files. The retry timer is a schedule, not an expiry.
EXPIRING = frozenset({"approval", "heartbeat"})
#: How the proposal ids of deadlines begin; no other proposal may use one (see decide).
TIMER_ID_PREFIX = "timer:"


def timer_proposal_id(run_id: str, revision: int, name: str) -> str:
    """The id of the proposal a run's deadline `name`, armed at `revision`, becomes.
    Deterministic: were it ever sent twice, the second would be a `duplicate`. It names
    the run, so it is unique across runs too (tools key outcomes by it); a run id too
    long for the id's 128 bytes is named by its SHA-256 (seen: a long run id made the
    punctuator fail on every tick)."""
    readable = f"{TIMER_ID_PREFIX}{run_id}:{revision}:{name}"
    if len(readable.encode()) <= MAX_PROPOSAL_ID_BYTES:
        return readable
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:32]
    return f"{TIMER_ID_PREFIX}{digest}:{revision}:{name}"


def retry_delay_ms(
    base_ms: int, max_ms: int, jitter: float, retry_count: int, run_id: str, revision: int
) -> int:
    """base * 2^retry_count, capped at max, scaled by a deterministic factor in
    [1 - jitter, 1 + jitter] so that many runs failing together do not retry together."""
    delay: int = min(max_ms, base_ms * (2 ** min(retry_count, 30)))
    digest = hashlib.sha256(f"{run_id}:{revision}".encode()).digest()
    unit = int.from_bytes(digest[:8], "big") / 2**64  # [0, 1)
    jittered: int = round(delay * (1 + jitter * (2 * unit - 1)))
    return max(1, jittered)


def _timer(
    kind: str, name: str, due_at_ms: int, event: str | None, reason: str | None, revision: int
) -> Timer:
    """A timer from values the engine computed from a checked machine and run: built
    unvalidated (validating each took about 1.5 us of a commit that arms one)."""
    return Timer.trusted(
        {
            "kind": kind,
            "name": name,
            "due_at_ms": due_at_ms,
            "event": event,
            "reason": reason,
            "revision": revision,
        }
    )


def arm_timers(
    machine: Machine,
    *,
    run_id: str,
    state: str,
    revision: int,
    entered_state_at_ms: int,
    updated_at_ms: int,
    heartbeat_at_ms: int | None,
    retry_count: int,
    max_retries: int,
    deadlines: Deadlines,
) -> list[Timer]:
    spec = machine.spec
    if state in machine.terminal:
        if spec.retention_ms is None:
            return []
        due = entered_state_at_ms + spec.retention_ms
        return [_timer("deadline", RETENTION, due, "forget", RETENTION, revision)]
    timers: list[Timer] = []
    for timeout in spec.timeouts:
        if timeout.state != state:
            continue
        if timeout.kind == "approval":
            after, since = deadlines.approval_timeout_ms or timeout.after_ms, entered_state_at_ms
        else:
            # From the run's latest sign of life: its latest transition or heartbeat.
            since = max(updated_at_ms, heartbeat_at_ms or updated_at_ms)
            after = deadlines.heartbeat_timeout_ms or timeout.after_ms
        if after is not None:
            timers.append(
                _timer(
                    "deadline", timeout.kind, since + after, timeout.event, timeout.reason, revision
                )
            )
            remind = timeout.remind_before_ms
            if timeout.kind == "approval" and remind is not None and remind < after:
                due = since + after - remind
                timers.append(_timer("alert", APPROVAL_REMINDER, due, None, None, revision))
    retry = spec.retry
    base = deadlines.retry_backoff_ms or (retry.backoff_base_ms if retry is not None else None)
    if retry is not None and base is not None and state in machine.retry_states:
        if retry_count < max_retries:
            delay = retry_delay_ms(
                base, retry.backoff_max_ms, retry.jitter, retry_count, run_id, revision
            )
            event: str | None = retry.event
        else:
            delay, event = 0, retry.exhausted_event
        if event is not None:
            timers.append(
                _timer(
                    "deadline", "retry", entered_state_at_ms + delay, event, RETRY_REASON, revision
                )
            )
    for alert in spec.alerts:
        if alert.state == state and (
            alert.min_retry_count is None or retry_count >= alert.min_retry_count
        ):
            timers.append(
                _timer(
                    "alert", alert.rule, entered_state_at_ms + alert.after_ms, None, None, revision
                )
            )
    return timers
