"""What the SDK raises, each saying what to do next.

`OutcomeTimeout` is kept for code written before these types: `Timeout` is one, so
`except OutcomeTimeout` still catches every timeout the SDK raises.
"""

from pydantic import ValidationError

from schemas.codes import RejectionCode
from schemas.messages import Heartbeat, Rejection, Transition


class OutcomeTimeout(TimeoutError):
    """No outcome arrived in time; the proposal may still be decided later."""


class Timeout(OutcomeTimeout):
    """No outcome arrived within the caller's timeout. The proposal was delivered and
    may still be decided: wait again, or send it again with the same proposal id (a
    retry of a committed proposal is answered with the original transition)."""


class Unavailable(ConnectionError):
    """Kafka (or every given worker URL) could not be reached, or a proposal could not
    be delivered, within the caller's timeout. The proposal may or may not have been
    delivered: send it again with the same proposal id, which is safe."""


class InvalidArgument(ValueError):
    """An argument the SDK cannot send or use (a run id too long or with a control
    character, a payload that is not JSON, a worker URL that is no http(s) URL): the
    message names each field and what it must be. Nothing was sent."""

    @classmethod
    def of(cls, error: ValidationError, what: str) -> "InvalidArgument":
        """One line for pydantic's report on `what` (field: what is wrong; ...)."""
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or what}: {e['msg']}" for e in error.errors()
        )
        # One line whatever the input held (a key's newline shows escaped).
        shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in problems)
        return cls(f"invalid {what}: {shown}")


class NotFound(LookupError):
    """What the call needs does not exist: the run to decide on or to continue, or the
    topics at the client's prefix. The message says which, and what to do."""


class NotAwaited(LookupError):
    """A wait for a proposal this client does not expect an outcome of: it was not
    proposed through this client, its outcome was already handed over, or too many
    proposals went unclaimed since. Follow every partition with `client.waiter()`
    before others send proposals you wait for."""


class NotServed(LookupError):
    """The workers answered a read but none could serve it (a run whose owner is not
    known, or not caught up within its bound): ask again, or give the owner's URL."""


class Rejected(Exception):
    """A proposal was refused: `rejection` is the `Rejection` the worker published,
    `code` and `detail` its reason."""

    def __init__(self, rejection: Rejection) -> None:
        self.rejection = rejection
        self.code: RejectionCode = rejection.code
        self.detail: str = rejection.detail
        super().__init__(
            f"proposal '{rejection.proposal_id}' rejected: {self.code.value}: {self.detail}"
        )

    @staticmethod
    def raise_for(outcome: "Transition | Heartbeat | Rejection") -> "Transition | Heartbeat":
        """The outcome when it is a `Transition` or a `Heartbeat`; `Rejected` when it
        is a `Rejection`."""
        if isinstance(outcome, Rejection):
            raise Rejected(outcome)
        return outcome
