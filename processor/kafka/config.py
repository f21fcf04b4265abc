"""Kafka client settings: bootstrap servers plus any librdkafka setting, passed through.

Every setting of the clients (security.protocol, sasl.*, ssl.*, ...) can be given as
`-X key=value` on the command line or as RUNSTATE_KAFKA_<KEY> in the environment, with
dots written as underscores (RUNSTATE_KAFKA_SASL_MECHANISM=PLAIN -> sasl.mechanism).
"""

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
#: librdkafka's own log lines, as records of this Python logger (each client hands them
#: over when it is polled): the application's logging decides where they go.
KAFKA_LOG = logging.getLogger("runstate.kafka")
# Nothing on stderr unless the application configures logging (a library's manners).
KAFKA_LOG.addHandler(logging.NullHandler())
KAFKA_ENV_PREFIX = "RUNSTATE_KAFKA_"


def client_config_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {
        name[len(KAFKA_ENV_PREFIX) :].lower().replace("_", "."): value
        for name, value in environ.items()
        if name.startswith(KAFKA_ENV_PREFIX) and len(name) > len(KAFKA_ENV_PREFIX)
    }


def parse_settings(items: Iterable[str]) -> dict[str, str]:
    """`key=value` strings to a dict; a clear error for anything else."""
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"'{item}' is not key=value (e.g. -X security.protocol=SASL_SSL)")
        settings[key.strip()] = value
    return settings


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str = DEFAULT_BOOTSTRAP
    client_config: dict[str, str] = field(default_factory=dict)

    @classmethod
    def resolve(cls, bootstrap: str | None, flags: Iterable[str] = ()) -> "KafkaSettings":
        """Flags win over RUNSTATE_KAFKA_* variables; bootstrap from flag/env or default."""
        config = {**client_config_from_env(), **parse_settings(flags)}
        bootstrap = bootstrap or config.pop("bootstrap.servers", None) or DEFAULT_BOOTSTRAP
        config.pop("bootstrap.servers", None)
        return cls(bootstrap, config)

    def client(
        self,
        overrides: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Settings for a confluent-kafka client: `defaults` (tunable), then the user's
        settings, then `overrides` (what correctness depends on, e.g. isolation.level)."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            # librdkafka's info lines (disconnects at exit) are noise for users.
            "log_level": 4,
            "logger": KAFKA_LOG,
            # A broker back from a restart is reached within a second: librdkafka's
            # reconnect backoff otherwise grows to 10 s, all of it added to a failover.
            "reconnect.backoff.max.ms": 1000,
            # A broker frozen with its sockets open (a GC pause, a stopped VM) holds every
            # request sent to it this long before the client tries elsewhere (librdkafka:
            # 60 s); its controller fenced it after seconds.
            "socket.timeout.ms": 10_000,
            **(defaults or {}),
            **self.client_config,
            **(overrides or {}),
        }
