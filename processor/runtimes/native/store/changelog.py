"""What turns the changelog's records into a partition store's rows on restore: a
snapshot record's index fields and a history record's revision and proposal id, read
from their headers (from the record itself without one), and one restore batch's
records as the rows of one WriteBatch (`ChangelogBatch`), the indexes moved with them."""

import json
import struct
from collections import Counter
from typing import TYPE_CHECKING

from rocksdict import WriteBatch

from processor.records.changelog_keys import (
    ANSWER_CHANGELOG_PREFIX,
    FIRED_CHANGELOG_PREFIX,
    HISTORY_CHANGELOG_PREFIX,
    TimerMarks,
    Where,
    parse_answer_changelog_key,
    parse_history_changelog_key,
    parse_index,
    parse_revision_header,
)
from processor.records.punctuator import NOT_FIRED, Fired
from processor.runtimes.native.store.indexes import index_state, reindex, snapshot_timers
from processor.runtimes.native.store.keys import (
    BY_STATE,
    BY_STATE_OF,
    FIRED,
    HISTORY,
    PROPOSAL,
    REFUSED,
    TIMER_OF,
    history_key,
    past,
    proposal_key,
    run_key,
    run_prefixes,
)

if TYPE_CHECKING:
    from processor.runtimes.native.store.partition import PartitionStore

#: A changelog record as restore takes it: key, value and, if it has one, the header that
#: carries what the indexes need (INDEX_HEADER of a snapshot, REVISION_HEADER of history).
ChangelogRecord = tuple[bytes, bytes | None] | tuple[bytes, bytes | None, bytes | None]


def index_fields(value: bytes, index: bytes | None = None) -> tuple[Where, TimerMarks]:
    """((machine, state, entered_state_at_ms), timers) of a snapshot record: from its
    index header, or, for a record written without one, from the snapshot itself."""
    if index is not None:
        return parse_index(index)
    data = json.loads(value)
    timers = [(t["due_at_ms"], t["revision"], t["name"]) for t in data.get("timers", [])]
    return (data["machine"], data["state"], data["entered_state_at_ms"]), timers


def restored_index(value: bytes, header: bytes | None) -> tuple[Where, TimerMarks]:
    """`index_fields`, reading the common header, a run without timers whose machine and
    state need no JSON escapes (`["machine","state",entered,[]]`), without the JSON
    decoder (header parsing measured a few microseconds a record on the 2-core benchmark
    machine: seconds of a 1M-run restore)."""
    if header is not None and header.startswith(b'["') and header.endswith(b",[]]"):
        names, sep, entered = header[2:-4].rpartition(b'",')
        machine, sep2, state = names.partition(b'","')
        if sep and sep2 and entered.isdigit() and b"\\" not in names and b'"' not in state:
            return (machine.decode(), state.decode(), int(entered)), []
    return index_fields(value, header)


def committed_by(value: bytes, header: bytes | None = None) -> tuple[int, str]:
    """(revision, proposal id) of a transition record: from its header, or from the
    record itself (a header written before it carried the proposal id)."""
    if header is not None:
        revision, proposal_id = parse_revision_header(header)
        if proposal_id is not None:
            return revision, proposal_id
    data = json.loads(value)
    return int(data["revision"]), str(data["proposal_id"])


_HISTORY_AT = len(HISTORY_CHANGELOG_PREFIX)
_LENGTH = struct.Struct(">I").pack


def history_puts(
    key: bytes, value: bytes | None, header: bytes | None
) -> tuple[bytes, bytes, bytes] | None:
    """(history key, proposal key, its revision) of a changelog history record (`key`
    has HISTORY_CHANGELOG_PREFIX) in the common form, a value and a "<revision>
    <proposal id>" header agreeing with the key, from the record's bytes: no run id
    decoded and encoded again, no JSON. None for any other (the checked path of
    `ChangelogBatch._aside` then takes it, and says what is wrong with it)."""
    if value is None or header is None:
        return None
    revision, _, proposal_id = header.partition(b" ")
    if not (proposal_id and revision.isdigit() and key[-9:-8] == b"\x00"):
        return None
    raw = key[_HISTORY_AT:-9]
    number = int(revision)
    if not raw or number != struct.unpack(">Q", key[-8:])[0]:
        return None
    raw.decode(), proposal_id.decode()  # identifiers are UTF-8: else a ValueError
    length = _LENGTH(len(raw))
    return (
        HISTORY + length + raw + key[-8:],
        PROPOSAL + length + raw + proposal_id,
        b"%d" % number,
    )


class ChangelogBatch:
    """Changelog records as the rows of one WriteBatch (a `PartitionStore.restore`):
    history, answers and fired marks as they come, each run's last snapshot with its
    by-state and due-time index entries moved to it (`index`), and the store's runs per
    state, `counts` (None when not counted), with them."""

    def __init__(self, store: "PartitionStore", counts: Counter[tuple[str, str]] | None) -> None:
        self.store = store
        self.batch = WriteBatch(raw_mode=True)
        self.counts = counts
        self.latest: dict[str, bytes | None] = {}
        self.marks: dict[str, Fired] = {}
        self.armed: dict[str, TimerMarks] = {}
        self.where_of: dict[str, Where] = {}

    def add(self, key: bytes, value: bytes | None, header: bytes | None) -> None:
        """One record; a ValueError, KeyError or TypeError for one not of this layout."""
        batch, latest, armed, where_of = self.batch, self.latest, self.armed, self.where_of
        if key[:1] == b"\x00" and self._aside(key, value, header):
            return
        run_id = key.decode()
        if value is None:
            where_of.pop(run_id, None)
            armed.pop(run_id, None)
            # Forgotten: what the records before this one put is dropped now, in
            # order, so a run id created again after it starts afresh.
            for prefix in run_prefixes(run_id):
                batch.delete_range(prefix, past(prefix))
        else:
            where_of[run_id], armed[run_id] = restored_index(value, header)
        # Only a run's last snapshot of the batch is written and indexed.
        latest[run_id] = value

    def _aside(self, key: bytes, value: bytes | None, header: bytes | None) -> bool:
        """A history record or fired marks restored; False for any other key."""
        batch, marks = self.batch, self.marks
        if key.startswith(HISTORY_CHANGELOG_PREFIX):
            # Half of a restore's records are history: in the common form their store
            # keys are put together from the record's bytes (see `history_puts`).
            puts = history_puts(key, value, header)
            if puts is not None:
                batch.put(puts[0], value)
                batch.put(puts[1], puts[2])
                return True
            run_id, revision = parse_history_changelog_key(key)
            if value is None:
                batch.delete(history_key(run_id, revision))
                return True
            committed, proposal_id = committed_by(value, header)
            if committed != revision:
                raise ValueError(f"history key of revision {revision} holds {committed}")
            batch.put(history_key(run_id, revision), value)
            batch.put(proposal_key(run_id, proposal_id), str(revision).encode())
            return True
        if key.startswith(ANSWER_CHANGELOG_PREFIX):
            run_id, proposal_id = parse_answer_changelog_key(key)
            if value is None:
                batch.delete(proposal_key(run_id, proposal_id))
            else:
                batch.put(proposal_key(run_id, proposal_id), REFUSED + value)
            return True
        if key.startswith(FIRED_CHANGELOG_PREFIX):
            run_id = key[len(FIRED_CHANGELOG_PREFIX) :].decode()
            if value is None:
                marks[run_id] = NOT_FIRED
                batch.delete(FIRED + run_id.encode())
            else:
                marks[run_id] = Fired.decode(value)
                batch.put(FIRED + run_id.encode(), value)
            return True
        return False

    def index(self) -> None:
        """The snapshots of the batch, the by-state and due-time indexes moved to
        them, and `counts` with them."""
        batch, latest, marks, counts = self.batch, self.latest, self.marks, self.counts
        armed, where_of = self.armed, self.where_of
        runs = sorted(latest)
        changed = sorted(set(latest) | set(marks))
        # One multi-get for what both indexes had, not a get per run and index.
        found = self.store.get_many(
            [BY_STATE_OF + r.encode() for r in runs] + [TIMER_OF + r.encode() for r in changed]
        )
        for run_id, old in zip(runs, found, strict=False):
            value = latest[run_id]
            where = None if value is None else where_of[run_id]
            if value is None:
                batch.delete(run_key(run_id))
            else:
                batch.put(run_key(run_id), value)
            index_state(batch, run_id, old, where)
            if counts is not None:
                if old is not None:
                    machine, state, _ = old[len(BY_STATE) :].split(b"\0", 2)
                    counts[(machine.decode(), state.decode())] -= 1
                if where is not None:
                    counts[where[:2]] += 1
        # Fired marks matter only to runs with timers: read for those alone.
        timers_of = {
            r: (
                armed.get(r, [])
                if r in latest
                else snapshot_timers(self.store.committed_snapshot(r))
            )
            for r in changed
        }
        timed = [r for r in changed if timers_of[r] and r not in marks]
        fired = dict(
            zip(timed, self.store.get_many([FIRED + r.encode() for r in timed]), strict=True)
        )
        for run_id, old in zip(changed, found[len(runs) :], strict=True):
            if not timers_of[run_id] and old is None:
                continue  # no timers before or now: an absent entry reads as no dues
            marked = marks.get(run_id)
            if marked is None:
                raw = fired.get(run_id)
                marked = NOT_FIRED if raw is None else Fired.decode(raw)
            reindex(batch, run_id, timers_of[run_id], marked, old)
