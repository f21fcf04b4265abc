"""The habits that keep the codebase readable run with the tests: ruff and mypy."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; install the dev extra: pip install -e '.[dev]'")
    return found


def test_ruff_lint() -> None:
    result = _run(_tool("ruff"), "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = _run(_tool("ruff"), "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr + "\nfix: ruff format ."


def test_mypy_strict_on_schemas_and_engine() -> None:
    # pyproject.toml makes schemas.* and processor.engine.* strict; the rest, and the
    # benchmarks, are checked too.
    result = _run(_tool("mypy"), "schemas", "processor", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr
