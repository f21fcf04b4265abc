"""Marks every test by its folder, so `pytest -m unit` / `-m integration` select a layer."""

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        layer = Path(item.fspath).relative_to(HERE).parts[0]
        if layer in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, layer))
