"""A partition store's two indexes of its runs, kept in the same WriteBatch as the
snapshots they point at: by state (`i/`: machine, state, time of entry, run id; `x/`
each run's entry there) and by due time of their timers not fired yet (`t/`: due time,
run id; `u/` each run's due times there). A commit moves a run's entries as it writes
the run; a restore moves them as it writes the changelog's snapshots."""

import json
from dataclasses import dataclass

from rocksdict import WriteBatch

from processor.records.punctuator import Fired
from processor.runtimes.native.store.keys import BY_STATE_OF, TIMER_OF, state_key, timer_key
from schemas.messages import RunSnapshot

#: What `u/` holds for a run with no timer left to fire.
NO_DUES = b"[]"


def snapshot_timers(snapshot: RunSnapshot | None) -> list[tuple[int, int, str]]:
    timers = snapshot.timers if snapshot is not None else []
    return [(t.due_at_ms, t.revision, t.name) for t in timers]


@dataclass(frozen=True)
class InState:
    """A run found by the by-state index: the oldest in a state come first."""

    entered_ms: int
    run_id: str
    machine: str
    state: str


def index_state(
    batch: WriteBatch,
    run_id: str,
    old: bytes | None,
    where: tuple[str, str, int] | None,
) -> None:
    """Move the run in the by-state index: `old` is its key there, `where` its
    (machine, state, entered_state_at_ms) now, None once it is gone."""
    new = None if where is None else state_key(*where, run_id)
    if old is not None and old != new:
        batch.delete(old)
    if new is None:
        batch.delete(BY_STATE_OF + run_id.encode())
    elif new != old:
        batch.put(new, b"")
        batch.put(BY_STATE_OF + run_id.encode(), new)


def reindex(
    batch: WriteBatch,
    run_id: str,
    timers: list[tuple[int, int, str]],
    fired: Fired,
    old: bytes | None,
) -> None:
    """Point the due-time index at the run's timers (due, revision, name) that have
    not fired; `old` is what the index held for the run."""
    dues = sorted({due for due, revision, name in timers if not fired.covers(revision, name, due)})
    encoded = json.dumps(dues).encode() if dues else NO_DUES
    if encoded == (NO_DUES if old is None else old):
        return  # the same due times: most commits keep the run's timers
    if old is not None and old != NO_DUES:
        for due in json.loads(old):
            batch.delete(timer_key(due, run_id))
    for due in dues:
        batch.put(timer_key(due, run_id), b"")
    batch.put(TIMER_OF + run_id.encode(), encoded)
