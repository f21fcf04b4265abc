"""One proposal record in, one outcome out: decode, authenticate, decide. Pure.

The worker runs this per record; replay, verification and tests run the very same
function over the proposals topic, which is why a replay reproduces every decision.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from processor.engine import Commit, Machine, decide
from processor.intake import (
    DEFAULT_MAX_PROPOSAL_BYTES,
    Headers,
    Undecodable,
    authenticate,
    decode_proposal,
    reject_unauthenticated,
)
from processor.keyring import Keyring
from schemas.codes import RejectionCode
from schemas.messages import Proposal, Rejection, RunSnapshot


@dataclass(frozen=True, slots=True)
class DeadLetterReason:
    """The record is not a proposal; it goes to the DLQ with this reason."""

    reason: str


Outcome = Commit | Rejection | DeadLetterReason


def decide_record(
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    timestamp_ms: int,
    *,
    keyring: Keyring,
    machines: Mapping[str, Machine],
    lookup: Callable[[str], RunSnapshot | None],
    max_bytes: int = DEFAULT_MAX_PROPOSAL_BYTES,
) -> Outcome:
    """The outcome of one record of the proposals topic.

    `timestamp_ms` is the record's broker timestamp; `lookup` gives a run's current
    snapshot (None when it does not exist).
    """
    decoded = decode_proposal(value, timestamp_ms, max_bytes)
    if isinstance(decoded, Undecodable):
        return DeadLetterReason(decoded.reason)
    if isinstance(decoded, Rejection):
        return decoded
    proposal: Proposal = decoded
    # Key and run must agree: the key picks the partition, and so the state store.
    if key is None or key.decode(errors="replace") != proposal.run_id:
        shown = "no key" if key is None else f"key '{key.decode(errors='replace')}'"
        return Rejection(
            code=RejectionCode.SCHEMA_INVALID,
            detail=f"record has {shown}; the key must be the run_id '{proposal.run_id}'",
            run_id=proposal.run_id,
            proposal_id=proposal.proposal_id,
            event=proposal.event,
            at_ms=timestamp_ms,
        )
    principal = authenticate(value or b"", headers, keyring)
    if isinstance(principal, str):
        return reject_unauthenticated(proposal, principal, timestamp_ms)
    return decide(machines, lookup(proposal.run_id), proposal, principal, timestamp_ms)
