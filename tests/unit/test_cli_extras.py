"""A command whose extra is not installed says which to install: exit 2 when run, its
help (exit 0) when asked for help."""

import pytest
from click.testing import CliRunner

from processor.cli.main import needs_extra

pytestmark = pytest.mark.unit


def test_a_missing_extra_is_named_and_help_is_no_error() -> None:
    command = needs_extra("worker", "worker", ["rocksdict"])
    for args in (["--help"], ["-h"], ["--state-dir", "x", "--help"]):
        helped = CliRunner().invoke(command, args)
        assert helped.exit_code == 0, helped.output
        assert "pip install 'runstate[worker]'" in helped.output
    refused = CliRunner().invoke(command, ["--state-dir", "x"])
    assert refused.exit_code == 2
    assert "rocksdict not installed" in refused.output
