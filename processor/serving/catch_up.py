"""Reads that wait for this worker's state to have what they must show: the writes
under way when the read came (read_fence.py), and a run's transition its reader saw
elsewhere (read your writes). Each wait is bounded by CATCH_UP_S, then answered 503."""

import threading
import time

from processor.serving.answers import Answer, json_answer
from processor.serving.node import Node, RunRecord
from schemas.messages import RunSnapshot

#: How long a read waits for the worker's state to have what it must show.
CATCH_UP_S = 5.0
CATCH_UP_POLL_S = 0.01
#: Reads that may wait for a revision at once; more are answered 503 at once.
MAX_WAITING_READS = 32
_WAITING = threading.BoundedSemaphore(MAX_WAITING_READS)


def wait_for_fence(node: Node) -> Answer | None:
    """None once the commits under way when the read came have reached this worker's
    state (read_fence.py); else, after CATCH_UP_S, the 503 to answer."""
    if node.read_fence.wait(CATCH_UP_S):
        return None
    return json_answer(
        503,
        {
            "error": f"a commit under way did not reach this worker's state within "
            f"{CATCH_UP_S:g} s (is the broker reachable?): ask again"
        },
    )


def caught_up(
    node: Node, run_id: str, partition: int, revision: int | None, at_ms: int | None
) -> RunRecord | Answer | None:
    """The run as this worker has it, once it has applied the run's transition
    `revision`, committed at broker time `at_ms` (as it is, when `revision` is None).

    The read fence already waited for this worker's own commits, so a run it lacks is
    gone (forgotten) or never was: that is answered at once. A run older than asked is
    waited for, briefly: a reader told of a transition by another worker (one that owned
    the partition before, or a stale one) asks one that may not have applied it yet."""
    record = node.run(run_id, partition, history=False)
    if _settled(record, revision, at_ms):
        return record
    assert record is not None and revision is not None
    # Each waiting read holds a server thread for up to CATCH_UP_S: a bounded number do,
    # so revisions asked far ahead (by mistake or not) cannot pile threads up.
    if not _WAITING.acquire(blocking=False):
        return _behind(run_id, record, revision, "too many reads are waiting already")
    try:
        deadline = time.monotonic() + CATCH_UP_S
        while time.monotonic() < deadline:
            time.sleep(CATCH_UP_POLL_S)
            record = node.run(run_id, partition, history=False)
            if _settled(record, revision, at_ms):
                return record
            assert record is not None
        return _behind(run_id, record, revision, f"after {CATCH_UP_S:g} s")
    finally:
        _WAITING.release()


def _settled(record: RunRecord | None, revision: int | None, at_ms: int | None) -> bool:
    """Nothing to wait for: not owned, no such run, no revision asked, or applied."""
    if record is None or record.snapshot is None or revision is None:
        return True
    return _applied(record.snapshot, revision, at_ms)


def _behind(run_id: str, record: RunRecord, revision: int, why: str) -> Answer:
    have = -1 if record.snapshot is None else record.snapshot.revision
    return json_answer(
        503,
        {
            "error": f"this worker has run '{run_id}' at revision {have}, older than the "
            f"{revision} asked for ({why}): it has not applied it yet; ask again",
            "revision": have,
            "min_revision": revision,
        },
    )


def _applied(snapshot: RunSnapshot, revision: int, at_ms: int | None) -> bool:
    """Whether `snapshot` is at or after the transition (`revision`, `at_ms`): at that
    revision or later, or a run of that id created after the transition was committed
    (the id forgotten and used again). The revision comes first: broker time is not
    monotonic across a leader change to a broker whose clock is behind."""
    if snapshot.revision >= revision:
        return True
    return at_ms is not None and snapshot.created_at_ms > at_ms
