"""How many examples a property tries.

Each property states its full count; `make test` (and so CI) runs every one in full
(`RUNSTATE_TEST_EXAMPLES=full`). A developer's quick loop (`make unit`, a bare `pytest`)
tries a quarter of each (at least ten examples, or a seed or two): the same properties, the same strategies, fewer
draws. Where a property keeps Hypothesis's database, a failure found is replayed first.
"""

import os

_SCALES = {"full": 1.0, "quick": 0.25}


def _scale() -> float:
    name = os.environ.get("RUNSTATE_TEST_EXAMPLES", "quick")
    if name not in _SCALES:
        raise ValueError(f"RUNSTATE_TEST_EXAMPLES={name!r}: use one of {sorted(_SCALES)}")
    return _SCALES[name]


SCALE = _scale()


def examples(full: int, least: int = 10) -> int:
    """The number of examples (or seeds) to try of a property whose full count is `full`."""
    return max(least, round(full * SCALE)) if SCALE < 1 else full
