"""A run's history for the Faust runtime, which keeps no history store: the run's
transitions as read from its partition of the transitions topic, each once (a repeat
after a crash is the same record, same `transition_id`), oldest first, up to the
revision of the snapshot the table holds. A run id forgotten (machine retention) and
created again starts a new history: only what follows its last `forget` is its own."""

from collections.abc import Iterable

from processor.engine.lint import FORGET_EVENT
from schemas.messages import Transition


def run_history(values: Iterable[bytes], revision: int) -> list[Transition]:
    """The transitions among `values` (one run's, in offset order) up to `revision`."""
    by_revision: dict[int, Transition] = {}
    for value in values:
        transition = Transition.model_validate_json(value)
        if transition.event == FORGET_EVENT:
            by_revision.clear()  # an earlier run of the same id
        elif transition.revision <= revision:
            by_revision.setdefault(transition.revision, transition)
    return [by_revision[r] for r in sorted(by_revision)]
