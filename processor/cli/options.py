"""One configuration convention for every command: a flag and a RUNSTATE_* variable."""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from processor.kafka.config import KafkaSettings
from processor.kafka.topics import TopicNames
from processor.records.intake import DEFAULT_MAX_PROPOSAL_BYTES
from processor.records.pipeline import DEFAULT_MAX_STATE_BYTES

ENV_PREFIX = "RUNSTATE_"


def option(*decls: str, env: str, **kwargs: Any) -> Callable[[Any], Any]:
    """A click option also read from RUNSTATE_<env>, and --help says so."""
    return click.option(*decls, envvar=ENV_PREFIX + env, show_envvar=True, **kwargs)


machine_path_option = option(
    "--machine-path",
    "machine_paths",
    env="MACHINE_PATH",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="A machine file or a folder of *.yaml machine files to load besides the built-ins "
    "(repeatable; in the environment, separate paths with ':').",
)

bootstrap_option = option(
    "--bootstrap-servers",
    env="BOOTSTRAP_SERVERS",
    default=None,
    help="Kafka bootstrap servers (host:port,...). Default 127.0.0.1:9092.",
)
# No single variable for this one: each setting is its own RUNSTATE_KAFKA_<KEY>.
kafka_setting_option = click.option(
    "-X",
    "--kafka",
    "kafka_settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Any Kafka client setting, e.g. -X security.protocol=SASL_SSL (repeatable). Also "
    "read from RUNSTATE_KAFKA_<KEY> variables, dots as underscores.",
)
topic_prefix_option = option(
    "--topic-prefix",
    env="TOPIC_PREFIX",
    default="runstate.",
    help="Prefix of every runstate topic name.",
)

keyring_file_option = option(
    "--keyring-file",
    env="KEYRING_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Keyring JSON (key id -> public key or HMAC secret, source, authority, validity, "
    "scope; `runstate keys` manages it). A worker reads the file again when it changes. "
    "RUNSTATE_KEYRING may hold the JSON itself instead.",
)
worker_url_option = option(
    "--worker-url",
    "worker_urls",
    env="WORKER_URL",
    multiple=True,
    default=("http://127.0.0.1:8080",),
    help="HTTP address of a worker (repeatable; the one owning the run answers).",
)
http_token_option = option(
    "--http-token",
    env="HTTP_TOKEN",
    default=None,
    help="The token to send to the workers' HTTP API (Authorization: Bearer), when they "
    "ask for one (they list it in RUNSTATE_HTTP_TOKENS or their tokens file). Prefer the "
    "variable: a flag's value shows in the process list.",
)

group_id_option = option(
    "--group-id", env="GROUP_ID", default="runstate", help="Consumer group of the workers."
)
state_dir_option = option(
    "--state-dir",
    env="STATE_DIR",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("state"),
    help="A worker's RocksDB partition stores (one directory per worker; replay writes "
    "the stores there).",
)


max_proposal_bytes_option = option(
    "--max-proposal-bytes",
    env="MAX_PROPOSAL_BYTES",
    type=click.IntRange(min=256),
    default=DEFAULT_MAX_PROPOSAL_BYTES,
    help="Larger proposals are refused schema_invalid (verify: the limit the workers ran with).",
)
max_state_bytes_option = option(
    "--max-state-bytes",
    env="MAX_STATE_BYTES",
    type=click.IntRange(min=4096),
    default=DEFAULT_MAX_STATE_BYTES,
    help="The largest snapshot or transition (JSON bytes) a commit may write; a proposal "
    "that would write more, or whose records to one topic would not fit one batch of it "
    "(its max.message.bytes), is refused state_too_large and the run stays as it was. The "
    "changelog and transitions topics must take records this large (workers check at "
    "start). verify: the limit the workers ran with.",
)


def _kafka_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--bootstrap-servers, -X and --topic-prefix: what every command that talks to
    Kafka takes, in the same order everywhere."""
    return bootstrap_option(kafka_setting_option(topic_prefix_option(command)))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class KafkaContext:
    """Where a command's Kafka is and what its topics are called, resolved once."""

    settings: KafkaSettings
    topics: TopicNames


def pass_kafka(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of `_kafka_options`, passed to the command resolved as one
    `kafka: KafkaContext` argument (-X and --bootstrap-servers over RUNSTATE_KAFKA_*,
    --topic-prefix). A -X that is not key=value is a usage error naming -X."""

    @functools.wraps(command)
    def resolved(
        *args: Any,
        bootstrap_servers: str | None,
        kafka_settings: tuple[str, ...],
        topic_prefix: str,
        **kwargs: Any,
    ) -> Any:
        try:
            settings = KafkaSettings.resolve(bootstrap_servers, kafka_settings)
        except ValueError as exc:
            ctx = click.get_current_context()
            param = next((p for p in ctx.command.params if p.name == "kafka_settings"), None)
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from exc
        kafka = KafkaContext(settings, TopicNames.with_prefix(topic_prefix))
        return command(*args, kafka=kafka, **kwargs)

    return _kafka_options(resolved)
