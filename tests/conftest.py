"""Marks every test by its folder, so `pytest -m unit` / `-m integration` select a layer,
and marks `engine` the tests that call the engine: `make test` measures the engine's
coverage over them."""

import inspect
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

from tests.examples import examples

HERE = Path(__file__).parent


#: Where the code the coverage gate measures (`make test`: processor.engine) is called from.
ENGINE_CALLERS = ("processor.engine", "tests.unit.driver")


def _calls_the_engine(module: ModuleType | None) -> bool:
    """Does the test module import the engine (or the driver around it)?"""
    for value in vars(module or ModuleType("none")).values():
        name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(name, str) and name.startswith(ENGINE_CALLERS):
            return True
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        layer = Path(item.fspath).relative_to(HERE).parts[0]
        if layer in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, layer))
        if _calls_the_engine(getattr(item, "module", None)):
            item.add_marker(pytest.mark.engine)


# A property without a count of its own tries Hypothesis's default hundred, scaled the same
# way; no deadline: the suite runs in parallel processes on a shared machine.
settings.register_profile("runstate", max_examples=examples(100), deadline=None)
settings.load_profile("runstate")
