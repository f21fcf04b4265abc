"""Kafka client settings: bootstrap servers plus any librdkafka setting, passed through.

Every setting of the clients (security.protocol, sasl.*, ssl.*, ...) can be given as
`-X key=value` on the command line or as RUNSTATE_KAFKA_<KEY> in the environment, with
dots written as underscores (RUNSTATE_KAFKA_SASL_MECHANISM=PLAIN -> sasl.mechanism).
"""

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from processor.engine import Machine
from processor.kafka.topics import TopicNames
from processor.records.intake import DEFAULT_MAX_PROPOSAL_BYTES
from processor.records.pipeline import DEFAULT_MAX_STATE_BYTES
from processor.trust.http_auth import HttpTokens
from processor.trust.keyring import Keyring

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
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


@dataclass
class WorkerConfig:
    """What a worker runs with, either runtime: Kafka, topics, keys, machines, state."""

    kafka: KafkaSettings
    topics: TopicNames
    keyring: Keyring
    machines: Mapping[str, Machine]
    state_dir: Path
    group_id: str = "runstate"
    worker_id: str | None = None
    commit_interval_ms: int = 100
    commit_max_records: int = 1_000
    max_proposal_bytes: int = DEFAULT_MAX_PROPOSAL_BYTES
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES
    transaction_timeout_ms: int = 10_000
    timer_interval_ms: int = 200
    timer_key_id: str | None = None  # keyring key that signs deadline proposals
    timer_key_file: Path | None = None  # signing key file that does (Ed25519 keyrings)
    keyring_file: Path | None = None  # read again when it changes
    static_membership: bool = False  # group.instance.id = worker id (KIP-345)
    http_host: str = "127.0.0.1"
    http_port: int | None = 0  # None: no HTTP server; 0: a free port
    #: What the HTTP API asks of every request but /livez (none: open, loopback only).
    http_tokens: HttpTokens = field(default_factory=HttpTokens)
    #: The other workers' HTTP URLs (`peers.origin`s): the only ones asked for the
    #: cluster's reads, and sent the token (whatever the group's members advertise).
    peers: tuple[str, ...] = ()
