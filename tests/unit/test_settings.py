"""One configuration convention: each setting of the worker is declared once, on
WorkerSettings, and is a flag, a RUNSTATE_* variable and a default; a flag wins over the
variable, the variable over the default, and both are checked the same way."""

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.cli.flags import is_flag, settings_options
from processor.cli.main import cli
from processor.runtimes.settings import WorkerSettings
from processor.settings import env_name
from tests.examples import examples

pytestmark = pytest.mark.unit


@click.command()
@settings_options(WorkerSettings)
def show(settings: WorkerSettings) -> None:
    click.echo(settings.model_dump_json())


def _run(args: list[str], env: dict[str, str] | None = None) -> click.testing.Result:
    return CliRunner().invoke(show, args, env=env or {})


def _shown(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    result = _run(args, env)
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def test_every_setting_is_a_flag_with_its_variable_in_the_workers_help() -> None:
    result = CliRunner().invoke(cli, ["worker", "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for name, field in WorkerSettings.model_fields.items():
        if not is_flag(field):  # a library setting, not a flag
            assert "--" + name.replace("_", "-") not in result.output
            continue
        assert env_name(name) in result.output, name
        assert field.description and field.description[:30] in result.output, name


def test_a_flag_wins_over_the_variable_which_wins_over_the_default() -> None:
    assert _shown([])["commit_interval_ms"] == 100
    env = {"RUNSTATE_COMMIT_INTERVAL_MS": "250", "RUNSTATE_RUNTIME": "faust"}
    assert _shown([], env)["commit_interval_ms"] == 250
    both = _shown(["--commit-interval-ms", "40"], env)
    assert (both["commit_interval_ms"], both["runtime"]) == (40, "faust")
    assert (
        _shown(["--dynamic-membership"], {"RUNSTATE_STATIC_MEMBERSHIP": "true"})[
            "static_membership"
        ]
        is False
    )
    assert _shown([], {"RUNSTATE_STATIC_MEMBERSHIP": "true"})["static_membership"] is True
    assert _shown([], {"RUNSTATE_LOG_LEVEL": "DEBUG"})["log_level"] == "debug"
    empty = {"RUNSTATE_WORKER_ID": "", "RUNSTATE_HTTP_PORT": "", "RUNSTATE_PEERS": ""}
    assert [_shown([], empty)[k] for k in ("worker_id", "http_port", "peers")] == [None, 8080, []]


def test_peers_from_flags_and_a_comma_separated_variable() -> None:
    env = {"RUNSTATE_PEERS": " http://W1:8080/ , https://w2.,http://w1:8080"}
    assert _shown([], env)["peers"] == ["http://w1:8080", "https://w2:443"]
    flags = ["--peer", "http://a:1", "--peer", "http://b:2"]
    assert _shown(flags, env)["peers"] == ["http://a:1", "http://b:2"]
    for args, env in (
        (["--peer", "http://good@evil:1"], {}),
        ([], {"RUNSTATE_PEERS": "http://good@evil:1"}),
    ):
        result = _run(args, env)
        assert result.exit_code == 2 and "user info" in result.output
        assert "--peer (or RUNSTATE_PEERS)" in result.output


def test_machine_paths_from_flags_and_a_colon_separated_variable(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b"
    a.write_text("x")
    b.mkdir()
    assert _shown([], {"RUNSTATE_MACHINE_PATH": f"{a}:{b}"})["machine_path"] == [str(a), str(b)]
    missing = tmp_path / "nowhere"
    result = _run([], {"RUNSTATE_MACHINE_PATH": f"{a}:{missing}"})
    assert result.exit_code == 2 and str(missing) in result.output
    assert "RUNSTATE_MACHINE_PATH" in result.output
    assert _run(["--machine-path", str(missing)]).exit_code == 2


INTEGERS = [
    name
    for name, field in WorkerSettings.model_fields.items()
    if field.annotation is int and is_flag(field)
]
# What an environment can hold: no NUL, no lone surrogate (not UTF-8).
VALUES = st.integers(-(2**20), 2**20) | st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=4
)


@settings(max_examples=examples(60), deadline=None)
@given(name=st.sampled_from(INTEGERS), value=VALUES)
def test_a_flag_and_its_variable_accept_and_refuse_the_same_values(
    name: str, value: object
) -> None:
    """Whatever the value, given as a flag or as the variable: the same setting, or a
    usage error (exit 2) naming the variable, never a traceback."""
    flag = "--" + name.replace("_", "-")
    text = str(value)
    by_variable = _run([], {env_name(name): text})
    if text == "":  # an empty variable is unset
        assert by_variable.exit_code == 0 and by_variable.output == _run([]).output
        return
    by_flag = _run([flag, text])
    assert by_flag.exit_code in (0, 2) and by_variable.exit_code in (0, 2), (
        by_flag.output,
        by_variable.output,
    )
    assert by_flag.exit_code == by_variable.exit_code, (by_flag.output, by_variable.output)
    if by_flag.exit_code == 0:
        assert by_flag.output == by_variable.output
    else:
        assert env_name(name) in by_variable.output
