"""The Faust runtime takes the user's librdkafka settings as Faust's, or refuses them."""

import shutil
import ssl
import subprocess
from pathlib import Path

import certifi
import pytest
from faust.auth import GSSAPICredentials, SASLCredentials, SSLCredentials
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from faust.types.auth import AuthProtocol, SASLMechanism

from processor.runtimes.errors import WorkerError
from processor.runtimes.faust.kafka import SUPPORTED, faust_kafka_settings


def test_plaintext_by_default_and_client_settings_converted() -> None:
    settings = faust_kafka_settings(
        {
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "1000",
            "max.poll.interval.ms": "300000",
            "client.id": "w1",
            "group.instance.id": "w1-static",
            "message.max.bytes": "2000000",
            "linger.ms": "5",
            "compression.type": "zstd",
            "acks": "all",
            "metadata.max.age.ms": "60000",
        }
    )
    assert settings == {
        "broker_credentials": None,
        "broker_session_timeout": 6.0,
        "broker_heartbeat_interval": 1.0,
        "broker_max_poll_interval": 300.0,
        "broker_client_id": "w1",
        "consumer_group_instance_id": "w1-static",
        "producer_max_request_size": 2_000_000,
        "producer_linger": 0.005,
        "producer_compression_type": "zstd",
        "producer_acks": -1,
        "consumer_metadata_max_age_ms": 60_000,
        "producer_metadata_max_age_ms": 60_000,
    }
    assert faust_kafka_settings({"compression.codec": "none"})["producer_compression_type"] is None


def test_a_setting_without_an_equivalent_is_refused_not_ignored() -> None:
    with pytest.raises(WorkerError, match=r"no equivalent for Kafka setting.*enable\.idempotence"):
        faust_kafka_settings({"enable.idempotence": "true", "client.id": "x"})
    with pytest.raises(WorkerError, match=r"sasl\.oauthbearer\.config"):
        faust_kafka_settings({"security.protocol": "SASL_SSL", "sasl.oauthbearer.config": "x"})


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("session.timeout.ms", "six"),
        ("acks", "2"),
        ("compression.type", "brotli"),
        ("check.crcs", "maybe"),
        ("security.protocol", "TLS"),
    ],
)
def test_invalid_values_are_refused_with_the_setting_named(setting: str, value: str) -> None:
    with pytest.raises(WorkerError, match=setting.replace(".", r"\.")):
        faust_kafka_settings({setting: value})


def test_sasl_ssl_scram_with_a_ca_file() -> None:
    creds = faust_kafka_settings(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "s3cret",
            "ssl.ca.location": certifi.where(),
        }
    )["broker_credentials"]
    assert isinstance(creds, SASLCredentials)
    assert creds.protocol is AuthProtocol.SASL_SSL
    assert creds.mechanism is SASLMechanism.SCRAM_SHA_512
    assert (creds.username, creds.password) == ("alice", "s3cret")
    assert creds.ssl_context is not None
    assert creds.ssl_context.check_hostname and creds.ssl_context.verify_mode == ssl.CERT_REQUIRED
    # what aiokafka is given
    auth = credentials_to_aiokafka_auth(creds)
    assert auth["security_protocol"] == "SASL_SSL"
    assert auth["sasl_mechanism"] == "SCRAM-SHA-512"
    assert auth["sasl_plain_username"] == "alice" and auth["sasl_plain_password"] == "s3cret"


def test_sasl_plaintext_plain() -> None:
    creds = faust_kafka_settings(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "p",
        }
    )["broker_credentials"]
    assert isinstance(creds, SASLCredentials)
    assert creds.protocol is AuthProtocol.SASL_PLAINTEXT and creds.ssl_context is None
    assert creds.mechanism is SASLMechanism.PLAIN


def test_sasl_defaults_to_gssapi_like_librdkafka() -> None:
    creds = faust_kafka_settings(
        {"security.protocol": "SASL_PLAINTEXT", "sasl.kerberos.service.name": "kafka-prod"}
    )["broker_credentials"]
    assert isinstance(creds, GSSAPICredentials)
    assert creds.kerberos_service_name == "kafka-prod"
    with pytest.raises(WorkerError, match=r"sasl\.username is not used by sasl\.mechanism=GSSAPI"):
        faust_kafka_settings({"security.protocol": "SASL_PLAINTEXT", "sasl.username": "u"})


def test_sasl_mistakes_are_refused() -> None:
    with pytest.raises(WorkerError, match=r"needs sasl\.password"):
        faust_kafka_settings(
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u"}
        )
    with pytest.raises(WorkerError, match=r"OAUTHBEARER"):
        faust_kafka_settings({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"})
    # credentials for a protocol that would not use them
    with pytest.raises(WorkerError, match=r"sasl\.password, sasl\.username given but"):
        faust_kafka_settings({"sasl.username": "u", "sasl.password": "p"})
    with pytest.raises(WorkerError, match=r"ssl\.ca\.location given but security\.protocol is"):
        faust_kafka_settings(
            {"security.protocol": "SASL_PLAINTEXT", "ssl.ca.location": certifi.where()}
        )


def test_ssl_with_system_cas_and_verification_switches() -> None:
    creds = faust_kafka_settings({"security.protocol": "SSL"})["broker_credentials"]
    assert isinstance(creds, SSLCredentials) and creds.protocol is AuthProtocol.SSL
    assert creds.context.check_hostname
    no_host = faust_kafka_settings(
        {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "none"}
    )["broker_credentials"]
    assert not no_host.context.check_hostname
    assert no_host.context.verify_mode == ssl.CERT_REQUIRED
    unverified = faust_kafka_settings(
        {"security.protocol": "SSL", "enable.ssl.certificate.verification": "false"}
    )["broker_credentials"]
    assert unverified.context.verify_mode == ssl.CERT_NONE


def test_ssl_files_that_cannot_be_used_are_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkerError, match=r"SSL settings cannot be used"):
        faust_kafka_settings(
            {"security.protocol": "SSL", "ssl.ca.location": str(tmp_path / "missing.pem")}
        )
    with pytest.raises(WorkerError, match=r"ssl\.key\.location is given without"):
        faust_kafka_settings({"security.protocol": "SSL", "ssl.key.location": "k.pem"})


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_ssl_client_certificate_with_an_encrypted_key(tmp_path: Path) -> None:
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-days",
            "1",
            "-subj",
            "/CN=runstate-test",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-passout",
            "pass:kpw",
        ],
        check=True,
        capture_output=True,
    )
    base = {
        "security.protocol": "SSL",
        "ssl.ca.location": str(cert),
        "ssl.certificate.location": str(cert),
        "ssl.key.location": str(key),
    }
    creds = faust_kafka_settings({**base, "ssl.key.password": "kpw"})["broker_credentials"]
    assert isinstance(creds, SSLCredentials)
    with pytest.raises(WorkerError, match=r"SSL settings cannot be used"):
        faust_kafka_settings({**base, "ssl.key.password": "wrong"})


def test_the_names_supported_are_librdkafkas() -> None:
    assert {"security.protocol", "sasl.username", "ssl.ca.location"} <= SUPPORTED
    assert "bootstrap.servers" not in SUPPORTED  # KafkaSettings takes it apart
