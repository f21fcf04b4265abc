"""Bad input to the SDK and the CLI is one documented error naming what is wrong, never
a traceback: any run id, event, payload or worker URL a caller may pass."""

import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.cli.main import cli
from processor.client import InvalidArgument
from processor.client.core import proposal_record
from processor.client.reader import RunReader
from processor.kafka.topics import TopicNames
from processor.trust.keygen import new_key
from processor.trust.keyring import Algorithm
from tests.examples import examples

pytestmark = pytest.mark.unit

KEY = new_key("runtime", Algorithm.HMAC_SHA256, "runtime", "runtime")[1]
TOPICS = TopicNames.with_prefix()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


@settings(max_examples=examples(400), deadline=None)
@given(
    run_id=st.text(max_size=300),
    event=st.text(max_size=80),
    payload=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
)
def test_a_proposal_is_built_or_refused_with_one_line(
    run_id: str, event: str, payload: dict[str, Any]
) -> None:
    try:
        record = proposal_record(TOPICS, KEY, run_id, event, payload=payload)
    except InvalidArgument as exc:
        assert "\n" not in str(exc) and str(exc).startswith("invalid proposal: ")
    else:
        assert record.run_id == run_id and record.key == run_id.encode()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_number_json_cannot_carry_is_refused_not_changed(value: float) -> None:
    """A payload that JSON cannot carry is refused; it is never sent as something else
    (NaN as null)."""
    with pytest.raises(InvalidArgument, match=r"payload"):
        proposal_record(TOPICS, KEY, "r", "start", payload={"x": [1, value]})


@settings(max_examples=examples(400), deadline=None)
@given(url=st.one_of(st.text(max_size=40), st.from_regex(r"\A[a-zA-Z]{0,6}://.{0,30}\Z")))
def test_a_worker_url_is_taken_or_refused_with_one_line(url: str) -> None:
    try:
        reader = RunReader([url])
    except InvalidArgument as exc:
        assert "\n" not in str(exc) and "worker URL" in str(exc)
    else:
        (base,) = reader._worker_urls
        assert base.split("://")[0].lower() in ("http", "https")


@pytest.mark.parametrize(
    "url", ["notaurl", "ftp://x", "http://[::1", "http://h:99999", "http://u:p@h:1", "http://h/?q"]
)
@pytest.mark.parametrize("command", [["get", "r1"], ["history", "r1"], ["stats"]])
def test_the_cli_names_a_bad_worker_url(command: list[str], url: str) -> None:
    result = CliRunner().invoke(cli, [*command, "--worker-url", url])
    assert result.exit_code == 2, result.output
    assert "Invalid value for --worker-url: worker URL" in result.output
    assert isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("run_id", ["a\x01b", "x" * 300, "\x7f"])
@pytest.mark.parametrize(
    "command", [["create", "{run}", "task_lifecycle"], ["propose", "{run}", "start"]]
)
def test_the_cli_names_a_bad_run_id(
    command: list[str], run_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("processor.cli.options.reach", lambda settings, within_s: None)
    keyring = tmp_path / "keyring.json"
    assert CliRunner().invoke(cli, ["keys", "generate", str(keyring)]).exit_code == 0
    args = [a.replace("{run}", run_id) for a in command]
    env = {
        "RUNSTATE_SIGNING_KEY_FILE": str(tmp_path / "keyring.private" / "runtime.key.json"),
        "RUNSTATE_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    }
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 2, result.output
    assert "invalid proposal: run_id: " in result.output
    assert isinstance(result.exception, SystemExit)
