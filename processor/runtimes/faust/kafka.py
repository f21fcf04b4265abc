"""The user's Kafka settings (librdkafka's names, from `-X` / RUNSTATE_KAFKA_*) as the
Faust app's: credentials and an SSL context for aiokafka, and the client settings that
have a Faust equivalent. A setting without one is refused with the list of those that
have, never ignored: a worker must not run without the security it was given.
"""

import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from faust.auth import GSSAPICredentials, SASLCredentials, SSLCredentials
from faust.types.auth import CredentialsT

from processor.runtimes.errors import WorkerError

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI")
_SASL = (
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "sasl.kerberos.service.name",
)
_SSL = (
    "ssl.ca.location",
    "ssl.ca.pem",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
)


def _ms_to_s(value: str) -> float:
    return int(value) / 1000


def _compression(value: str) -> str | None:
    codec = value.strip().lower()
    if codec not in ("none", "gzip", "snappy", "lz4", "zstd"):
        raise ValueError("one of none, gzip, snappy, lz4, zstd")
    return None if codec == "none" else codec


def parse_acks(value: str) -> int:
    """librdkafka's acks (all, -1, 0, 1) as Kafka's number (-1: every replica)."""
    acks = {"all": -1, "-1": -1, "0": 0, "1": 1}.get(value.strip().lower())
    if acks is None:
        raise ValueError("one of all, -1, 0, 1")
    return acks


def _bool(value: str) -> bool:
    flag = value.strip().lower()
    if flag not in ("true", "false"):
        raise ValueError("true or false")
    return flag == "true"


#: librdkafka setting -> (Faust settings it sets, how its value converts).
_CLIENT: dict[str, tuple[tuple[str, ...], Callable[[str], Any]]] = {
    "client.id": (("broker_client_id",), str),
    "group.instance.id": (("consumer_group_instance_id",), str),
    "session.timeout.ms": (("broker_session_timeout",), _ms_to_s),
    "heartbeat.interval.ms": (("broker_heartbeat_interval",), _ms_to_s),
    "max.poll.interval.ms": (("broker_max_poll_interval",), _ms_to_s),
    "socket.timeout.ms": (("broker_request_timeout",), _ms_to_s),
    "request.timeout.ms": (("producer_request_timeout",), _ms_to_s),
    "metadata.max.age.ms": (("consumer_metadata_max_age_ms", "producer_metadata_max_age_ms"), int),
    "connections.max.idle.ms": (
        ("consumer_connections_max_idle_ms", "producer_connections_max_idle_ms"),
        int,
    ),
    "max.partition.fetch.bytes": (("consumer_max_fetch_size",), int),
    "check.crcs": (("broker_check_crcs",), _bool),
    "message.max.bytes": (("producer_max_request_size",), int),
    "batch.size": (("producer_max_batch_size",), int),
    "linger.ms": (("producer_linger",), _ms_to_s),
    "queue.buffering.max.ms": (("producer_linger",), _ms_to_s),
    "compression.type": (("producer_compression_type",), _compression),
    "compression.codec": (("producer_compression_type",), _compression),
    "acks": (("producer_acks",), parse_acks),
    "request.required.acks": (("producer_acks",), parse_acks),
}

SUPPORTED = frozenset({"security.protocol", *_SASL, *_SSL, *_CLIENT})


def faust_kafka_settings(client_config: Mapping[str, str]) -> dict[str, Any]:
    """Faust app settings for these librdkafka settings (`KafkaSettings.client_config`);
    `broker_credentials` is always among them (None for PLAINTEXT)."""
    unknown = sorted(set(client_config) - SUPPORTED)
    if unknown:
        raise WorkerError(
            f"the faust runtime has no equivalent for Kafka setting(s) {', '.join(unknown)} "
            f"(given with -X or RUNSTATE_KAFKA_*); it takes: {', '.join(sorted(SUPPORTED))}. "
            "Leave them out, or use --runtime native (every librdkafka setting)"
        )
    settings: dict[str, Any] = {}
    for name, (targets, convert) in _CLIENT.items():
        if name in client_config:
            try:
                value = convert(client_config[name])
            except ValueError as exc:
                raise WorkerError(
                    f"Kafka setting {name}={client_config[name]!r} is not valid: {exc}"
                ) from exc
            for target in targets:
                settings[target] = value
    settings["broker_credentials"] = credentials(client_config)
    return settings


def credentials(client_config: Mapping[str, str]) -> CredentialsT | None:
    """aiokafka's credentials for librdkafka's security settings (None: PLAINTEXT)."""
    protocol = client_config.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in _PROTOCOLS:
        raise WorkerError(f"security.protocol={protocol!r} is not one of {', '.join(_PROTOCOLS)}")
    uses_ssl = protocol in ("SSL", "SASL_SSL")
    uses_sasl = protocol.startswith("SASL_")
    for group, used in ((_SSL, uses_ssl), (_SASL, uses_sasl)):
        stray = sorted(name for name in group if name in client_config and not used)
        if stray:
            raise WorkerError(
                f"Kafka setting(s) {', '.join(stray)} given but security.protocol is "
                f"{protocol}: they would not be used (set security.protocol)"
            )
    context = ssl_context(client_config) if uses_ssl else None
    if not uses_sasl:
        return None if context is None else SSLCredentials(context)
    mechanism = (
        client_config.get("sasl.mechanism") or client_config.get("sasl.mechanisms") or "GSSAPI"
    ).strip()  # librdkafka's default mechanism is GSSAPI too
    if mechanism.upper() not in _MECHANISMS:
        raise WorkerError(
            f"sasl.mechanism={mechanism!r}: the faust runtime supports {', '.join(_MECHANISMS)}"
            " (OAUTHBEARER needs a token provider librdkafka's settings cannot name)"
        )
    mechanism = mechanism.upper()
    if mechanism == "GSSAPI":
        for name in ("sasl.username", "sasl.password"):
            if name in client_config:
                raise WorkerError(f"{name} is not used by sasl.mechanism=GSSAPI")
        return GSSAPICredentials(
            kerberos_service_name=client_config.get("sasl.kerberos.service.name", "kafka"),
            ssl_context=context,
        )
    if "sasl.kerberos.service.name" in client_config:
        raise WorkerError(f"sasl.kerberos.service.name is not used by sasl.mechanism={mechanism}")
    missing = [n for n in ("sasl.username", "sasl.password") if n not in client_config]
    if missing:
        raise WorkerError(f"sasl.mechanism={mechanism} needs {' and '.join(missing)}")
    return SASLCredentials(
        username=client_config["sasl.username"],
        password=client_config["sasl.password"],
        ssl_context=context,
        mechanism=mechanism,
    )


def ssl_context(client_config: Mapping[str, str]) -> ssl.SSLContext:
    """An SSL context as librdkafka would verify the brokers: the CA given (a file, a
    directory, inline PEM, or the system's with `probe` or none), a client certificate if
    given, host names checked unless `ssl.endpoint.identification.algorithm=none`."""
    ca = client_config.get("ssl.ca.location", "probe")
    try:
        if ca == "probe":
            context = ssl.create_default_context(cadata=client_config.get("ssl.ca.pem"))
        elif Path(ca).is_dir():
            context = ssl.create_default_context(capath=ca, cadata=client_config.get("ssl.ca.pem"))
        else:
            context = ssl.create_default_context(cafile=ca, cadata=client_config.get("ssl.ca.pem"))
        cert = client_config.get("ssl.certificate.location")
        key = client_config.get("ssl.key.location")
        if key is not None and cert is None:
            raise WorkerError("ssl.key.location is given without ssl.certificate.location")
        if cert is not None:
            context.load_cert_chain(cert, key, client_config.get("ssl.key.password"))
        elif "ssl.key.password" in client_config:
            raise WorkerError("ssl.key.password is given without ssl.certificate.location")
    except (OSError, ssl.SSLError) as exc:
        raise WorkerError(f"the SSL settings cannot be used: {exc}") from exc
    algorithm = client_config.get("ssl.endpoint.identification.algorithm", "https").lower()
    if algorithm not in ("https", "none"):
        raise WorkerError(f"ssl.endpoint.identification.algorithm={algorithm!r}: https or none")
    context.check_hostname = algorithm == "https"
    verify = client_config.get("enable.ssl.certificate.verification", "true")
    try:
        if not _bool(verify):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    except ValueError as exc:
        raise WorkerError(f"enable.ssl.certificate.verification={verify!r}: {exc}") from exc
    return context
