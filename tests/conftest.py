"""Marks every test by its folder, so `pytest -m unit` / `-m integration` select a layer."""

from pathlib import Path

import pytest
from hypothesis import settings

from tests.examples import examples

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        layer = Path(item.fspath).relative_to(HERE).parts[0]
        if layer in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, layer))


# A property without a count of its own tries Hypothesis's default hundred, scaled the same
# way; no deadline: the suite runs in parallel processes on a shared machine.
settings.register_profile("runstate", max_examples=examples(100), deadline=None)
settings.load_profile("runstate")
