"""Answered means answered: a proposal id gets one outcome for its run's life.

A run remembers what it answered each proposal id it was sent by a principal within its
scope: the revision a commit made, or the rejection a refusal got (`content_digest`
set), for as long as the run lives (its retention drops the memory with it). The same
id sent again with the same content (`proposal_digest`: event, reason, payload,
metadata and the principal) gets that first answer again; with any other content it is
refused `proposal_id_reused`, which says nothing of the first answer beyond its kind.

Not remembered, because no principal stands behind them, or another principal could
otherwise take a run's ids from it: refusals before the proposal is proven (undecodable,
wrong key or partition, unsigned, stale), refusals of a run that does not exist or is
out of the key's scope, and a proposal that takes a deadline's id. `unknown_machine` of
an existing run says this worker cannot decide the run, not what the proposal deserves:
not remembered either. A heartbeat is no answer: heartbeats are taken in the order they
were signed (see `decide`).
"""

from typing import NamedTuple

from schemas.audit import proposal_digest
from schemas.messages import Principal, Proposal, Rejection, Transition


class Answer(NamedTuple):
    """What a run answered a proposal id: committed at `revision`, or refused with
    `rejection`. `digest` is the content first answered (None: not known, as for ids
    committed before digests were kept; such an id is taken to be the same proposal)."""

    revision: int | None
    digest: str | None
    rejection: Rejection | None = None

    @property
    def kind(self) -> str:
        return "committed" if self.rejection is None else "refused"


def digest_of(proposal: Proposal, principal: Principal) -> str:
    return proposal_digest(
        proposal.event,
        proposal.reason,
        proposal.payload,
        proposal.metadata,
        principal.source,
        principal.authority,
    )


def committed_digest(transition: Transition) -> str:
    """The digest of the proposal a transition committed."""
    return proposal_digest(
        transition.event,
        transition.reason,
        transition.payload,
        transition.metadata,
        transition.principal.source,
        transition.principal.authority,
    )
