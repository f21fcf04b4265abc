"""A run's checkpoint: the agent's intermediate data, kept with the run and bounded.

Measured as the bytes of its RFC 8785 canonical JSON, the form the hash chain hashes it
in, so the limit does not depend on how a producer spaced or ordered its JSON.
"""

from typing import Any

import rfc8785

#: The largest checkpoint a run keeps, in bytes of canonical JSON (64 KiB). A constant,
#: not a worker setting: every worker, `replay` and `verify` must decide it alike.
CHECKPOINT_MAX_BYTES = 64 * 1024


def checkpoint_size(data: dict[str, Any]) -> int:
    """The bytes of `data` as RFC 8785 canonical JSON."""
    return len(rfc8785.dumps(data))


def oversized(data: dict[str, Any]) -> str | None:
    """Why `data` is too large to be a run's checkpoint, or None when it fits."""
    size = checkpoint_size(data)
    if size <= CHECKPOINT_MAX_BYTES:
        return None
    return (
        f"checkpoint data is {size} bytes of canonical JSON; the limit is "
        f"{CHECKPOINT_MAX_BYTES}: keep large data in your own storage and checkpoint a "
        "reference to it"
    )
