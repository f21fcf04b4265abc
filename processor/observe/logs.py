"""Logging for the processes: readable lines on a terminal, or one JSON object per line
for a log pipeline (`--log-format json`), at these levels:

  ERROR  state that could not be persisted (the transaction was aborted, nothing applied)
  WARN   one line per refused proposal (a rejection: who asked for what, and why not)
         and per DLQ record (a record that is not a proposal)
  INFO   the worker's life: partitions assigned, restored, released
  DEBUG  one line per committed transition and heartbeat (after its transaction
         committed), and internals

A transition is not logged at INFO: the transitions topic is its record, and a line for
each cost the worker tens of microseconds per proposal at full load.
"""

import logging
from collections.abc import Iterable

from pythonjsonlogger.json import JsonFormatter

from processor.engine import Beat, Commit, Forget, Relay
from processor.kafka.config import KAFKA_LOG
from processor.records.pipeline import DeadLetterReason
from schemas.messages import Rejection

FORMATS = ("text", "json")


def setup_logging(level: str, fmt: str = "text") -> None:
    """Configure the root logger; `level` is debug, info, warning or error."""
    handler: logging.Handler
    if fmt == "json":
        handler = logging.StreamHandler()
        # Fields a log pipeline indexes; the records' `extra` fields are added as keys.
        handler.setFormatter(
            JsonFormatter(
                "%(levelname)s %(name)s %(message)s",
                rename_fields={"levelname": "level", "name": "logger"},
                timestamp="time",  # ISO 8601, UTC
            )
        )
    else:
        # Plain lines, not rich's layout: at DEBUG there is one per transition, and rich
        # spends near a millisecond on each (a plain formatter: microseconds).
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    KAFKA_LOG.setLevel(logging.NOTSET)  # librdkafka's lines at the worker's level


OUTCOMES_LOG = logging.getLogger("runstate.outcomes")
_LEVELS: dict[type, int] = {
    Beat: logging.DEBUG,
    Commit: logging.DEBUG,
    Forget: logging.DEBUG,
    Relay: logging.DEBUG,
    Rejection: logging.WARNING,
    DeadLetterReason: logging.WARNING,
}


def logged(outcome: Commit | Beat | Forget | Rejection | Relay | DeadLetterReason) -> bool:
    """Whether `log_outcomes` writes a line for `outcome` at the current level (the
    runtimes keep an outcome for the log only then)."""
    if isinstance(outcome, Relay) and outcome.refusal is not None:
        return True
    return OUTCOMES_LOG.isEnabledFor(_LEVELS.get(type(outcome), logging.WARNING))


def log_outcomes(
    outcomes: Iterable[Commit | Beat | Forget | Rejection | Relay | DeadLetterReason],
) -> None:
    """Committed outcomes at their levels (DEBUG per transition and heartbeat, WARNING per
    rejection and per DLQ record), with the fields a log pipeline indexes."""
    for outcome in outcomes:
        if isinstance(outcome, Beat):
            h = outcome.heartbeat
            OUTCOMES_LOG.debug(
                "%s: alive at %d (deadline %s)",
                h.run_id,
                h.at_ms,
                h.deadline_ms,
                extra={"run_id": h.run_id, "proposal_id": h.proposal_id},
            )
        elif isinstance(outcome, Commit | Forget):
            t = outcome.transition
            OUTCOMES_LOG.debug(
                "%s: %s -> %s on %s by %s",
                t.run_id,
                t.from_state,
                t.to_state,
                t.event,
                t.principal.source,
                extra={
                    "run_id": t.run_id,
                    "machine": t.machine,
                    "revision": t.revision,
                    "from_state": t.from_state,
                    "to_state": t.to_state,
                    "event": t.event,
                    "proposal_id": t.proposal_id,
                    "principal": t.principal.source,
                },
            )
        elif isinstance(outcome, Relay):
            if outcome.refusal is not None:
                log_outcomes([outcome.refusal])
            p = outcome.proposal
            OUTCOMES_LOG.debug(
                "%s: sent to run %s (%s)",
                p.event,
                p.run_id,
                p.proposal_id,
                extra={"run_id": p.run_id, "event": p.event, "proposal_id": p.proposal_id},
            )
        elif isinstance(outcome, Rejection):
            OUTCOMES_LOG.warning(
                "%s: %s refused (%s): %s",
                outcome.run_id,
                outcome.event,
                outcome.code.value,
                outcome.detail,
                extra={
                    "run_id": outcome.run_id,
                    "event": outcome.event,
                    "state": outcome.state,
                    "code": outcome.code.value,
                    "proposal_id": outcome.proposal_id,
                },
            )
        else:
            OUTCOMES_LOG.warning(
                "record sent to the DLQ: %s", outcome.reason, extra={"reason": outcome.reason}
            )
