"""Launcher errors, version pins, client settings and topic plans, without a broker."""

import re
import stat
from pathlib import Path

import pytest
import yaml

from processor.broker.jars import (
    KAFKA_VERSION,
    BrokerError,
    ensure_jars,
    find_java,
    find_maven,
    resource,
)
from processor.kafka.config import KafkaSettings, client_config_from_env, parse_settings
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames

ROOT = Path(__file__).resolve().parents[2]


def test_compose_and_pom_pin_the_launchers_kafka_version() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    image = f"apache/kafka:{KAFKA_VERSION}"
    assert compose["services"]["kafka"]["image"] == "${RUNSTATE_BROKER_IMAGE:-" + image + "}"
    assert (ROOT / "deploy" / "images" / "build").read_text().count(
        "kafka_image=apache/kafka:$KAFKA_VERSION"
    ) == 1
    for name in ("pom.xml", "tools-pom.xml"):
        pom = resource(name).read_text()
        assert re.search(r"<kafka.version>(.+?)</kafka.version>", pom).group(1) == KAFKA_VERSION  # type: ignore[union-attr]


def test_compose_runs_topic_setup_before_the_worker() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert "runstate topics create" in " ".join(services["topics"]["command"])
    assert services["worker"]["command"] == ["runstate", "worker"]
    assert services["worker"]["environment"]["RUNSTATE_KEYRING_FILE"] == "/keys/keyring.json"
    assert services["worker"]["depends_on"]["topics"]["condition"] == (
        "service_completed_successfully"
    )
    probe = ["CMD", "python3", "-m", "processor.runtimes.native.probe", "readyz"]
    assert services["worker"]["healthcheck"]["test"] == probe
    assert (
        'CMD ["python3", "-m", "processor.runtimes.native.probe", "readyz"]'
        in (ROOT / "Dockerfile").read_text()
    )


def test_compose_survives_down_and_up_and_scales() -> None:
    """Kafka keeps its data in a named volume (down/up keeps the topics the workers'
    state came from); each worker replica gets a state volume of its own and a host
    port of its own, so --scale worker=3 clashes on neither; both restart on failure."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    kafka, worker = compose["services"]["kafka"], compose["services"]["worker"]
    assert "kafka-data:/var/lib/kafka/data" in kafka["volumes"]
    assert kafka["environment"]["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"
    assert "kafka-data" in compose["volumes"] and "state" not in compose["volumes"]
    assert "/state" in worker["volumes"]  # anonymous: one per container
    assert worker["environment"]["RUNSTATE_STATE_DIR"] == "/state"
    assert worker["ports"] == ["8080"]  # a free host port per replica
    for service in (kafka, worker):
        assert service["restart"] == "unless-stopped"
        assert service["healthcheck"]["test"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "\nUSER runstate\n" in dockerfile and "-r constraints.txt" in dockerfile


def test_compose_gives_the_worker_a_token_and_prometheus_the_same() -> None:
    """The worker listens on 0.0.0.0 there, so it needs a token to start at all; the
    setup writes one into a volume the worker and Prometheus mount (not the keyring's)."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    worker, prometheus = services["worker"], services["prometheus"]
    assert worker["environment"]["RUNSTATE_HTTP_HOST"] == "0.0.0.0"
    token = worker["environment"]["RUNSTATE_HTTP_TOKENS_FILE"]
    assert token == "/http-auth/token" and token in " ".join(services["topics"]["command"])
    for service in (worker, prometheus):
        assert "http-auth:/http-auth:ro" in service["volumes"]
    assert not any(v.startswith("keys:") for v in prometheus["volumes"])
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (job,) = scrape["scrape_configs"]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": token}


def test_the_health_probe_answers_from_the_worker_api() -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from processor.runtimes.native.probe import main, probe

    class Ready(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/livez" else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert probe("livez", port) and not probe("readyz", port)
        assert not probe("livez", 1)  # nobody there
        assert main(["probe", "nonsense"]) == 2
    finally:
        server.shutdown()


def test_missing_java_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", "/nonexistent/jdk")
    with pytest.raises(BrokerError, match="Java 17"):
        find_java()


def test_old_java_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.22\" 2024-01-16' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(BrokerError, match=r"Java 11; Kafka .* needs Java 17"):
        find_java()


def test_missing_maven_names_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BrokerError, match="apt install maven"):
        find_maven()
    monkeypatch.setenv("RUNSTATE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(BrokerError, match="Maven"):
        ensure_jars()  # nothing cached, nothing to fetch with


def test_kafka_settings_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"RUNSTATE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "RUNSTATE_KAFKA_SASL_MECHANISM": "PLAIN"}
    assert client_config_from_env(env) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
    }
    monkeypatch.setenv("RUNSTATE_KAFKA_SASL_MECHANISM", "PLAIN")
    settings = KafkaSettings.resolve(
        "b:9092", ["sasl.mechanism=SCRAM-SHA-512", "ssl.ca.location=/ca"]
    )
    client = settings.client({"group.id": "g"})
    assert client["bootstrap.servers"] == "b:9092"
    assert client["sasl.mechanism"] == "SCRAM-SHA-512"  # flag wins over environment
    assert client["ssl.ca.location"] == "/ca" and client["group.id"] == "g"
    with pytest.raises(ValueError, match="not key=value"):
        parse_settings(["security.protocol"])
    assert KafkaSettings.resolve(None, ["bootstrap.servers=x:1"]).bootstrap_servers == "x:1"


def test_topic_plan_settings() -> None:
    plans = {p.role: p for p in plan_topics(TopicNames.with_prefix("rs."), 12, 3)}
    assert plans["proposals"].name == "rs.proposals"
    assert plans["proposals"].config["message.timestamp.type"] == "LogAppendTime"
    assert plans["changelog"].config["cleanup.policy"] == "compact"
    assert plans["changelog"].partitions == plans["proposals"].partitions == 12
    assert plans["transitions"].config["retention.ms"] == "-1"
    assert all(
        p.replication == 3 and p.config["min.insync.replicas"] == "2" for p in plans.values()
    )
    single = plan_topics(TopicNames.with_prefix(), 1, 1)
    assert all("min.insync.replicas" not in p.config for p in single)


def test_broker_source_follows_the_choice_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from processor.broker.provide import broker_source

    for name in ("KAFKA_BOOTSTRAP_SERVERS", "RUNSTATE_BOOTSTRAP_SERVERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # no engine
    monkeypatch.setenv("RUNSTATE_BROKER_SOURCE", "launcher")
    assert broker_source().kind == "launcher"
    monkeypatch.setenv("RUNSTATE_BROKER_SOURCE", "auto")
    fallback = broker_source()
    assert fallback.kind == "launcher" and "no Docker engine answers" in fallback.why
    monkeypatch.setenv("RUNSTATE_BROKER_SOURCE", "docker")
    with pytest.raises(BrokerError, match="RUNSTATE_BROKER_SOURCE=docker, but no Docker engine"):
        broker_source()
    monkeypatch.setenv("RUNSTATE_BROKER_SOURCE", "podman")
    with pytest.raises(BrokerError, match="expected one of auto, docker, launcher"):
        broker_source()
    monkeypatch.setenv("RUNSTATE_BROKER_SOURCE", "auto")
    monkeypatch.setenv("RUNSTATE_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    assert broker_source().kind == "configured"
