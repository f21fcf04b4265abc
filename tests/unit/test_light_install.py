"""The light install: `pip install runstate` is what an agent installs, so the
SDK, the wire contracts and the CLI's light commands must not import the worker's
packages, and a worker command in that install says which extra to add (exit 2).
tests/integration/test_light_install.py builds that install for real."""

import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from processor.cli import main as cli_main
from processor.cli.main import COMMANDS, cli, missing_from_extra

# Top-level modules of the worker extra (and what they pull in: aiokafka, mode, docker).
WORKER_MODULES = (
    "rocksdict",
    "faust",
    "mode",
    "aiokafka",
    "aiohttp",
    "cramjam",
    "multidict",
    "prometheus_client",
    "pythonjsonlogger",
    "testcontainers",
    "docker",
)


def _worker_modules_after(*imports: str) -> list[str]:
    """Which of WORKER_MODULES a fresh interpreter has loaded after these imports."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(imports)!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {list(WORKER_MODULES)!r} if m in sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout)
    return loaded


def test_the_sdk_and_the_contracts_import_nothing_of_the_worker() -> None:
    # If this fails after a change to processor/client (or to what it imports:
    # config, keyring, partitioning, readback, topics, http_auth, signatures, engine,
    # schemas), make the heavy import lazy, inside the function that needs it.
    assert _worker_modules_after("processor.client", "schemas", "processor.cli.main") == []


def test_the_light_commands_import_nothing_of_the_worker() -> None:
    light = sorted({module for module, _, extra in COMMANDS.values() if extra is None})
    assert _worker_modules_after(*light) == []


def test_every_command_is_registered_under_its_own_name() -> None:
    ctx = click.Context(cli)
    assert cli.list_commands(ctx) == sorted(COMMANDS)
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None and command.name == name


def test_a_full_install_lacks_nothing_of_the_worker_extra() -> None:
    assert missing_from_extra("worker") == []
    assert missing_from_extra("no-such-extra") == []


@pytest.fixture
def light(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if installed without the worker extra."""
    monkeypatch.setattr(cli_main, "missing_from_extra", lambda extra: ["rocksdict"])


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["worker"], 2),
        (["replay", "--force"], 2),
        (["worker", "--help"], 0),  # help is no error: it says what to install
        (["worker", "--state-dir", "x", "-h"], 0),
    ],
)
@pytest.mark.usefixtures("light")
def test_a_worker_command_without_the_extra_names_it(args: list[str], code: int) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == code, result.output
    assert "pip install 'runstate[worker]'" in result.output
    assert f"`runstate {args[0]}` needs the worker extra" in result.output
    assert "rocksdict not installed" in result.output


@pytest.mark.usefixtures("light")
def test_without_the_extra_the_help_still_lists_every_command() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0, result.output
    for name in COMMANDS:
        assert f"  {name} " in result.output
    assert "Needs pip install 'runstate[worker]'" in result.output
    # A light command is itself, not a stand-in.
    assert CliRunner().invoke(cli, ["keys", "--help"]).exit_code == 0


def test_a_missing_module_of_our_own_is_a_bug_not_an_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(COMMANDS, "ghost", ("processor.cli.no_such_module", "ghost", "worker"))
    with pytest.raises(ModuleNotFoundError):
        cli.get_command(click.Context(cli), "ghost")


def test_a_module_the_metadata_did_not_list_still_gets_the_extras_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Run from a source tree (no metadata) with a worker package missing.
    monkeypatch.setitem(COMMANDS, "ghost", ("no_such_worker_package", "ghost", "worker"))
    command = cli.get_command(click.Context(cli), "ghost")
    assert command is not None
    result = CliRunner().invoke(command, [])
    assert result.exit_code == 2
    assert "no_such_worker_package not installed" in result.output
