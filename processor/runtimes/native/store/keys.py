"""The layout of a partition store's keys: each kind of record has a namespace of its
own, a two-byte tag (`s/`, `h/`, ...) followed by fields of fixed width or
length-prefixed, with the run id last; run ids are valid UTF-8 without control
characters (schemas.identifiers), so every key decodes back to what it was made of. The
layout's version is kept under `m/format` and checked when a store opens
(`open_database`): an older layout is rebuilt from the topics, a newer one refused.
"""

import logging
import shutil
import struct
from pathlib import Path

from rocksdict import Options, Rdict

SNAPSHOT = b"s/"
HISTORY = b"h/"
OFFSET = b"o/"
TIMER = b"t/"  # t/ + due (8 bytes, big-endian) + run id -> b""
TIMER_OF = b"u/"  # u/ + run id -> JSON list of the run's index dues
FIRED = b"f/"  # f/ + run id -> JSON {"revision": r, "names": [...]}
BY_STATE = b"i/"  # i/ + machine \0 state \0 + entered (8 bytes) + run id -> b""
BY_STATE_OF = b"x/"  # x/ + run id -> its key in the by-state index
REFUSALS = b"j/"  # j/ + run id (length-prefixed) + at (8 bytes) + proposal id -> Rejection
# p/ + run id (length-prefixed) + proposal id -> what the run answered it: the revision
# that committed it, or REFUSED + the rejection (its answer for the run's life)
PROPOSAL = b"p/"
REFUSED = b"!"
_META = b"m/"  # m/ + name -> value (the layout's format version)
FORMAT_KEY = _META + b"format"
#: The layout of keys and values described above. Raise it with any change to them.
#: 2: the proposal ids of every run (`p/`); fired marks name their timers' due times.
#: 3: history and proposal ids restored from the changelog's history records (a store
#: restores from the changelog alone); forgotten runs.
#: 4: refusals a run remembers, among its proposal ids (`p/`).
STORE_FORMAT = 4
log = logging.getLogger("runstate.store")


def run_key(run_id: str) -> bytes:
    return SNAPSHOT + run_id.encode()


def history_prefix(run_id: str) -> bytes:
    raw = run_id.encode()
    # Length-prefixed so no run id is a prefix of another's keys.
    return HISTORY + struct.pack(">I", len(raw)) + raw


def history_key(run_id: str, revision: int) -> bytes:
    return history_prefix(run_id) + struct.pack(">Q", revision)


def proposals_prefix(run_id: str) -> bytes:
    raw = run_id.encode()
    return PROPOSAL + struct.pack(">I", len(raw)) + raw


def proposal_key(run_id: str, proposal_id: str) -> bytes:
    return proposals_prefix(run_id) + proposal_id.encode()


def past(prefix: bytes) -> bytes:
    """The end of a delete_range over every key that starts with `prefix` (what follows
    a prefix here is fixed-width numbers or UTF-8, never nine 0xFF bytes)."""
    return prefix + b"\xff" * 9


def state_prefix(machine: str, state: str) -> bytes:
    return BY_STATE + machine.encode() + b"\0" + state.encode() + b"\0"


def state_key(machine: str, state: str, entered_ms: int, run_id: str) -> bytes:
    return state_prefix(machine, state) + struct.pack(">Q", max(0, entered_ms)) + run_id.encode()


def refusals_prefix(run_id: str) -> bytes:
    raw = run_id.encode()
    return REFUSALS + struct.pack(">I", len(raw)) + raw


def run_prefixes(run_id: str) -> tuple[bytes, bytes, bytes]:
    """The prefixes of the keys a run has many of: its history, its proposal ids and its
    refusals (a forgotten run's are deleted by range, each up to its `past`)."""
    return history_prefix(run_id), proposals_prefix(run_id), refusals_prefix(run_id)


def timer_key(due_ms: int, run_id: str) -> bytes:
    return TIMER + struct.pack(">Q", max(0, due_ms)) + run_id.encode()


class StoreFormatError(RuntimeError):
    """A state directory written by a newer runstate."""


def _is_empty(db: Rdict) -> bool:
    return next(iter(db.keys()), None) is None


def open_database(path: Path, options: Options) -> Rdict:
    """Open the store, checking its layout's version; an older layout is dropped (the
    changelog rebuilds it), a newer one refused."""
    db = Rdict(str(path), options)
    raw = db.get(FORMAT_KEY)
    found = int(raw) if raw is not None else (None if _is_empty(db) else 1)
    if found is None or found == STORE_FORMAT:
        db.put(FORMAT_KEY, str(STORE_FORMAT).encode())
        return db
    if found > STORE_FORMAT:
        db.close()
        raise StoreFormatError(
            f"the store at {path} has layout {found}, newer than this worker's "
            f"({STORE_FORMAT}): run the newer worker, or delete the directory to "
            "rebuild it from the topics"
        )
    log.warning(
        "store %s has layout %d (this worker writes %d): rebuilding it from the topics",
        path,
        found,
        STORE_FORMAT,
    )
    db.close()
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    db = Rdict(str(path), options)
    db.put(FORMAT_KEY, str(STORE_FORMAT).encode())
    return db
