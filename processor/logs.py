"""Logging for the processes: readable lines on a terminal, or one JSON object per line
for a log pipeline (`--log-format json`), at seed 003's levels:

  INFO   one line per committed transition (after its transaction committed)
  WARN   one line per rejection
  ERROR  state that could not be persisted (the transaction was aborted, nothing applied)
  DEBUG  internals
"""

import logging

from pythonjsonlogger.json import JsonFormatter

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
        # Plain lines, not rich's layout: at INFO there is one per transition, and rich
        # spends near a millisecond on each (a plain formatter: microseconds).
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
