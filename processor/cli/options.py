"""One configuration convention for every command: a flag and a RUNSTATE_* variable."""

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from processor.cli.flags import setting_option
from processor.kafka.config import KafkaSettings
from processor.kafka.reach import REACH_S, KafkaSettingsRefused, KafkaUnreachable, reach
from processor.kafka.topics import TopicNames
from processor.runtimes.settings import WorkerSettings
from processor.settings import ENV_PREFIX


def option(*decls: str, env: str, **kwargs: Any) -> Callable[[Any], Any]:
    """A click option also read from RUNSTATE_<env>, and --help says so."""
    return click.option(*decls, envvar=ENV_PREFIX + env, show_envvar=True, **kwargs)


# The settings a worker shares with the commands that must match it (verify, replay,
# machines): declared once, on the worker's settings model.
machine_path_option = setting_option(WorkerSettings, "machine_path", "machine_paths")
group_id_option = setting_option(WorkerSettings, "group_id")
state_dir_option = setting_option(WorkerSettings, "state_dir")
keyring_file_option = setting_option(WorkerSettings, "keyring_file")
max_proposal_bytes_option = setting_option(WorkerSettings, "max_proposal_bytes")
max_state_bytes_option = setting_option(WorkerSettings, "max_state_bytes")

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

worker_url_option = option(
    "--worker-url",
    "worker_urls",
    env="WORKER_URL",
    multiple=True,
    default=("http://127.0.0.1:8080",),
    help="HTTP address of a worker (repeatable). One is enough when the workers are each "
    "other's --peer: a worker asks the one owning the run.",
)
http_token_option = option(
    "--http-token",
    env="HTTP_TOKEN",
    default=None,
    help="The token to send to the workers' HTTP API (Authorization: Bearer), when they "
    "ask for one (they list it in RUNSTATE_HTTP_TOKENS or their tokens file). Prefer the "
    "variable: a flag's value shows in the process list.",
)


def _kafka_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--bootstrap-servers, -X and --topic-prefix: what every command that talks to
    Kafka takes, in the same order everywhere."""
    return bootstrap_option(kafka_setting_option(topic_prefix_option(command)))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class KafkaContext:
    """Where a command's Kafka is and what its topics are called, resolved once. The
    first use of `settings` checks that Kafka answers there (`reached`): a command that
    never talks to Kafka (a read from a worker's HTTP API) never waits for it."""

    configured: KafkaSettings
    topics: TopicNames
    _reached: bool = field(default=False, repr=False)

    @property
    def settings(self) -> KafkaSettings:
        return self.reached()

    def reached(self, within_s: float | None = None) -> KafkaSettings:
        """The settings, once Kafka answered at them within `within_s` (default
        REACH_S); else a one-line error (exit 1)."""
        if not self._reached:
            try:
                reach(self.configured, REACH_S if within_s is None else within_s)
            except (KafkaUnreachable, KafkaSettingsRefused) as exc:
                raise click.ClickException(str(exc)) from None
            object.__setattr__(self, "_reached", True)  # checked once per command
        return self.configured


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
