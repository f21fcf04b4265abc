"""One Kafka context for every command: `pass_kafka` resolves --bootstrap-servers, -X and
--topic-prefix (and their RUNSTATE_* variables) into one `kafka: KafkaContext`."""

from typing import Any

import click
import pytest
from click.testing import CliRunner

from processor.cli.main import cli
from processor.cli.options import KafkaContext, pass_kafka
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
    assert kafka.settings.bootstrap_servers == DEFAULT_BOOTSTRAP
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
