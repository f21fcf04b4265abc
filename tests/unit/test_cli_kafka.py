"""One Kafka context for every command: `pass_kafka` resolves --bootstrap-servers, -X and
--topic-prefix (and their RUNSTATE_* variables) into one `kafka: KafkaContext`."""

import faulthandler
import signal
import socket
import time
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaException

from processor.cli import options
from processor.cli import worker as worker_command
from processor.cli.main import cli
from processor.cli.options import KafkaContext, pass_kafka
from processor.kafka import reach as reach_module
from processor.kafka.config import DEFAULT_BOOTSTRAP, KafkaSettings
from processor.kafka.topics import TopicNames

# Each command that talks to Kafka, with the arguments it needs.
KAFKA_COMMANDS = [
    ["create", "r", "task_lifecycle"],
    ["propose", "r", "start"],
    ["get", "r"],
    ["tail"],
    ["replay"],
    ["verify"],
    ["topics", "create"],
    ["topics", "describe"],
]


def _probe() -> tuple[click.Command, list[Any]]:
    seen: list[Any] = []

    @click.command()
    @click.argument("name")
    @pass_kafka
    @click.option("--after", default="x")
    def probe(name: str, kafka: KafkaContext, after: str) -> None:
        """Probe."""
        seen.append((name, kafka, after))

    return probe, seen


def test_flags_and_environment_become_one_context() -> None:
    probe, seen = _probe()
    result = CliRunner().invoke(
        probe,
        ["n", "--topic-prefix", "t.", "-X", "acks=all", "--after", "y"],
        env={"RUNSTATE_BOOTSTRAP_SERVERS": "k:1", "RUNSTATE_KAFKA_SASL_MECHANISM": "PLAIN"},
    )
    assert result.exit_code == 0, result.output
    ((name, kafka, after),) = seen
    assert (name, after) == ("n", "y")
    assert kafka == KafkaContext(
        KafkaSettings("k:1", {"sasl.mechanism": "PLAIN", "acks": "all"}),
        TopicNames.with_prefix("t."),
    )


def test_defaults() -> None:
    probe, seen = _probe()
    result = CliRunner().invoke(probe, ["n"], env={"RUNSTATE_BOOTSTRAP_SERVERS": None})
    assert result.exit_code == 0, result.output
    kafka = seen[0][1]
    assert kafka.configured.bootstrap_servers == DEFAULT_BOOTSTRAP
    assert kafka.topics == TopicNames.with_prefix("runstate.")
    with pytest.raises(AttributeError):
        kafka.topics = TopicNames.with_prefix("x.")  # frozen


@pytest.mark.parametrize("command", KAFKA_COMMANDS)
def test_a_setting_that_is_not_key_value_is_a_usage_error_naming_x(command: list[str]) -> None:
    """Before anything reaches Kafka: exit 2, the flag named, the fix shown."""
    result = CliRunner().invoke(cli, [*command, "-X", "nonsense"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '-X' / '--kafka'" in result.output
    assert "'nonsense' is not key=value" in result.output


@pytest.mark.parametrize(
    "command", [c[:2] if c[0] == "topics" else c[:1] for c in KAFKA_COMMANDS] + [["worker"]]
)
def test_help_names_every_kafka_option_and_its_variable(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for text in (
        "--bootstrap-servers",
        "RUNSTATE_BOOTSTRAP_SERVERS",
        "-X, --kafka KEY=VALUE",
        "RUNSTATE_KAFKA_<KEY>",
        "--topic-prefix",
        "RUNSTATE_TOPIC_PREFIX",
    ):
        assert text in result.output, f"{command}: {text}"
    assert "kafka_settings" not in result.output and "KafkaContext" not in result.output


@pytest.mark.parametrize(
    "command",
    [
        ["machines", "versions"],
        ["tail"],
        ["topics", "create"],
        ["topics", "describe"],
        ["replay"],
        ["verify"],
        ["create", "r", "task_lifecycle", "--key-id", "runtime"],
        ["worker"],
    ],
)
def test_a_wrong_bootstrap_address_is_one_line_within_seconds(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No broker listens at the address: the command exits 1 with one line naming the
    address, librdkafka's complaint and the flag to fix, within its bound (here a
    tenth of a second: the bound, not the wait, is under test); no traceback, and no
    librdkafka line besides."""
    monkeypatch.setattr(reach_module, "REACH_S", 0.2)
    monkeypatch.setattr(options, "REACH_S", 0.2)
    monkeypatch.setattr(worker_command, "WORKER_REACH_S", 0.2)
    # The worker command's process-wide set-up stays out of the test process.
    monkeypatch.setattr(worker_command, "setup_logging", lambda *args: None)
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    monkeypatch.setattr(faulthandler, "register", lambda *args, **kw: None)
    keyring = tmp_path / "keyring.json"
    assert CliRunner().invoke(cli, ["keys", "generate", str(keyring)]).exit_code == 0
    env = {
        "RUNSTATE_BOOTSTRAP_SERVERS": f"127.0.0.1:{closed_port()}",
        "RUNSTATE_KEYRING_FILE": str(keyring),
        "RUNSTATE_SIGNING_KEY_FILE": str(tmp_path / "keyring.private" / "runtime.key.json"),
        "RUNSTATE_STATE_DIR": str(tmp_path / "state"),
    }
    started = time.monotonic()
    result = CliRunner().invoke(cli, command, env=env)
    assert time.monotonic() - started < 5
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: Kafka did not answer at 127.0.0.1:")
    assert "Connection refused" in lines[0] and "--bootstrap-servers" in lines[0]
    assert not isinstance(result.exception, KafkaException)


def closed_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_setting_the_kafka_client_refuses_is_one_line() -> None:
    result = CliRunner().invoke(
        cli, ["topics", "describe", "-X", "nonsense.key=1", "--bootstrap-servers", "127.0.0.1:1"]
    )
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert "refused its settings" in line and "nonsense.key" in line and "-X" in line
