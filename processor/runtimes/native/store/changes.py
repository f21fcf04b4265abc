"""A partition's changes for one Kafka transaction (`PartitionTransaction`), staged in
memory while the transaction is open and written to the store in one WriteBatch once it
committed (`flush`, or `prepare` and `PreparedWrite.apply`); an aborted transaction's
are simply dropped."""

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rocksdict import WriteBatch

from processor.engine import Beat, Commit
from processor.engine.answers import Answer, committed_digest
from processor.records.changelog_keys import answer_changelog_key
from processor.records.punctuator import NOT_FIRED, Fired
from schemas.messages import Rejection, RunSnapshot, Transition

if TYPE_CHECKING:
    from processor.runtimes.native.store.partition import PartitionStore


@dataclass
class PreparedWrite:
    """A transaction's changes as one WriteBatch, not yet written (see `prepare`)."""

    store: "PartitionStore"
    batch: WriteBatch
    changes: "PartitionTransaction"
    counts: Counter[tuple[str, str]] | None

    def apply(self, offsets: dict[str, int]) -> None:
        """Write the changes and the topic offsets they reach, atomically."""
        self.store.apply(self, offsets)


class PartitionTransaction:
    """What one Kafka transaction changes in a partition store, held in memory until the
    transaction committed (`flush`); an aborted transaction's is simply dropped. The
    engine decides against `snapshot`, which sees the transaction's own changes, so a
    run's proposals in one batch see each other."""

    def __init__(self, store: "PartitionStore", base: "PartitionTransaction | None" = None) -> None:
        self.store = store
        #: The previous transaction while its commit travels: its changes are not in the
        #: store yet, so this one reads through them (`base_committed` cuts the link once they
        #: are).
        self.base = base
        self.snapshots: dict[str, RunSnapshot] = {}
        self.snapshot_json: dict[str, bytes] = {}
        self.history: list[tuple[Transition, bytes]] = []
        self.fired_marks: dict[str, Fired] = {}
        self.refusals: list[tuple[Rejection, bytes]] = []
        # (run, proposal id) -> the transition that committed it
        self.committed: dict[tuple[str, str], Transition] = {}
        # (run, proposal id) -> the refusal the run remembers, as published
        self.answers: dict[tuple[str, str], tuple[Rejection, bytes]] = {}
        self.forgotten: set[str] = set()  # runs dropped by this transaction (retention)

    @property
    def empty(self) -> bool:
        return not (
            self.snapshots
            or self.history
            or self.fired_marks
            or self.refusals
            or self.answers
            or self.forgotten
        )

    def snapshot(self, run_id: str) -> RunSnapshot | None:
        """The run as the engine must see it: this transaction's changes included."""
        staged = self.snapshots.get(run_id)
        if staged is not None or run_id in self.forgotten:
            return staged
        if self.base is not None:
            return self.base.snapshot(run_id)
        return self.store.committed_snapshot(run_id)

    def fired(self, run_id: str) -> Fired:
        staged = self.fired_marks.get(run_id)
        if staged is not None or run_id in self.forgotten:
            return staged or NOT_FIRED
        if self.base is not None:
            return self.base.fired(run_id)
        return self.store.fired(run_id)

    def seen(self, run_id: str, proposal_id: str) -> Answer | None:
        """What the run answered `proposal_id`: this transaction's answers included."""
        key = (run_id, proposal_id)
        staged = self.committed.get(key)
        if staged is not None:
            return Answer(staged.revision, committed_digest(staged))
        refused = self.answers.get(key)
        if refused is not None:
            return Answer(None, refused[0].content_digest, refused[0])
        if run_id in self.forgotten:
            return None
        if self.base is not None:
            return self.base.seen(run_id, proposal_id)
        return self.store.seen(run_id, proposal_id)

    def answer_keys(self, run_id: str) -> list[bytes]:
        """The changelog keys of the refusals the run remembers, staged ones included."""
        keys = (
            set()
            if run_id in self.forgotten
            else set(
                self.base.answer_keys(run_id)
                if self.base is not None
                else self.store.answer_keys(run_id)
            )
        )
        keys.update(answer_changelog_key(r, p) for r, p in self.answers if r == run_id)
        return sorted(keys)

    def base_committed(self) -> None:
        """The base transaction's changes reached the store: read the store again."""
        self.base = None

    def stage(
        self,
        commit: Commit,
        transition_json: bytes | None = None,
        snapshot_json: bytes | None = None,
    ) -> None:
        """A commit; pass the JSON already written to the topics, if at hand, so the
        flush does not encode it again."""
        run_id = commit.snapshot.run_id
        encoded_transition, encoded_snapshot = commit.encoded or (None, None)
        self.snapshots[run_id] = commit.snapshot
        self.snapshot_json[run_id] = (
            snapshot_json or encoded_snapshot or commit.snapshot.model_dump_json().encode()
        )
        self.history.append(
            (
                commit.transition,
                transition_json
                or encoded_transition
                or commit.transition.model_dump_json().encode(),
            )
        )
        self.committed[(run_id, commit.transition.proposal_id)] = commit.transition

    def stage_beat(self, beat: Beat, snapshot_json: bytes | None = None) -> None:
        """A heartbeat: the run's snapshot alive, its heartbeat deadline moved."""
        run_id = beat.snapshot.run_id
        self.snapshots[run_id] = beat.snapshot
        self.snapshot_json[run_id] = snapshot_json or beat.snapshot.model_dump_json().encode()

    def stage_forget(self, run_id: str) -> None:
        """A run forgotten (its machine's retention passed): all of it goes at flush,
        this transaction's own changes to it too."""
        self.forgotten.add(run_id)
        self.snapshots.pop(run_id, None)
        self.snapshot_json.pop(run_id, None)
        self.fired_marks.pop(run_id, None)
        self.history = [(t, raw) for t, raw in self.history if t.run_id != run_id]
        self.refusals = [(r, raw) for r, raw in self.refusals if r.run_id != run_id]
        self.committed = {k: v for k, v in self.committed.items() if k[0] != run_id}
        self.answers = {k: v for k, v in self.answers.items() if k[0] != run_id}

    def stage_refusal(self, rejection: Rejection, encoded: bytes | None = None) -> None:
        """A refused proposal of an existing run (the inspector's timeline), and, when
        the run remembers it (`content_digest`), its answer to the proposal id."""
        encoded = encoded or rejection.model_dump_json().encode()
        self.refusals.append((rejection, encoded))
        if rejection.content_digest is not None and rejection.run_id is not None:
            self.answers[(rejection.run_id, rejection.proposal_id or "")] = (rejection, encoded)

    def stage_fired(self, run_id: str, revision: int, name: str, due_ms: int) -> Fired:
        marks = self.fired(run_id).with_name(revision, name, due_ms)
        self.fired_marks[run_id] = marks
        return marks

    def flush(self, offsets: dict[str, int]) -> None:
        """After the Kafka transaction committed: the changes and offsets, in one batch."""
        self.store.write(self, offsets)

    def prepare(self) -> PreparedWrite:
        """The batch `flush` would write, built now and written by its `apply`."""
        return self.store.prepare(self)
