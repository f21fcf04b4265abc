"""What the HTTP API asks of a runtime (`Node`), and what a runtime knows of one run
(`RunRecord`)."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from processor.engine import Machine
from processor.serving import peers
from processor.serving.read_fence import ReadFence
from processor.trust import http_auth
from schemas.messages import Rejection, RunSnapshot, Transition


@dataclass(frozen=True)
class RunRecord:
    """What a worker that owns a run's partition knows of it, as committed."""

    snapshot: RunSnapshot | None
    history: Sequence[Transition] = ()
    #: The run's refused proposals; None when the runtime keeps none (Faust).
    refusals: Sequence[Rejection] | None = ()


class Node(Protocol):
    """What the API asks of a runtime. Called from server threads: each runtime reads its
    state the way that is safe for it (the native one under its stores' lock, the Faust
    one on its event loop)."""

    @property
    def machines(self) -> Mapping[str, Machine]: ...

    @property
    def partition_count(self) -> int:
        """The proposals topic's partitions (0 until the worker has looked)."""

    @property
    def advertised_url(self) -> str | None:
        """The URL other workers reach this one at (it is in the group's description)."""

    @property
    def http_tokens(self) -> http_auth.HttpTokens:
        """The tokens this worker accepts; it sends the first to the other workers."""

    @property
    def configured_peers(self) -> Sequence[str]:
        """The other workers' URLs as configured (`peers.origin`s): the only ones it
        asks, sends its token to, or redirects a browser to."""

    @property
    def read_fence(self) -> ReadFence:
        """The writes whose outcomes may be seen before this worker's state has them."""

    def owned(self) -> list[int]:
        """The partitions whose state this worker holds and serves now."""

    def run(self, run_id: str, partition: int, *, history: bool) -> RunRecord | None:
        """The run in `partition` (None when this worker does not own it); its history
        and refusals only when `history` (they cost more)."""

    def runs_in_state(self, query: peers.StateQuery) -> Sequence[peers.RunInState]:
        """The owned runs the query asks for, in its order."""

    def local_stats(self) -> list[peers.StateStats]:
        """Runs per machine and state over the owned partitions, every state included."""

    def peers(self) -> list[peers.Peer]:
        """The group's members that advertise a URL, and what each owns."""

    def health(self) -> dict[str, Any]:
        """GET /health's body: who this is, what it owns, its counters."""

    def loop_idle_seconds(self) -> float:
        """How long since the worker's loop last turned."""

    def waiting(self) -> list[str]:
        """What keeps the worker from being ready, in words (empty: ready), its loop aside."""

    def metrics(self) -> bytes:
        """The Prometheus exposition."""
