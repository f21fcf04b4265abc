"""Marks every test by its folder, so `pytest -m unit` / `-m integration` select a layer;
under pytest-xdist, starts the one broker the processes share (tests.shared_broker)."""

from pathlib import Path
from typing import Any

import pytest

from tests.shared_broker import WORKER_INPUT_KEY, SharedBroker, wants_broker

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        layer = Path(item.fspath).relative_to(HERE).parts[0]
        if layer in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, layer))


#: The controller's shared broker, once started (pytest-xdist runs only).
_SHARED: list[SharedBroker] = []


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, the controller starts the one broker every process shares."""
    is_controller = not hasattr(config, "workerinput")
    if is_controller and getattr(config.option, "numprocesses", None) and wants_broker(config):
        _SHARED.append(SharedBroker())


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Each xdist process learns where the shared broker's address will be written."""
    if _SHARED:
        node.workerinput[WORKER_INPUT_KEY] = str(_SHARED[0].address_file)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _SHARED:
        _SHARED.pop().close()
