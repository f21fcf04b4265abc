"""The compose stack as a user runs it: `docker compose up --build` from this checkout,
three workers (`--scale worker=3`) and Prometheus (the observability profile) scraping
each, driven through the demo's stories, one worker container killed mid-drive, then
`down` and `up` again. Every proposal gets exactly one
outcome, every run's snapshot is what it was, and `runstate verify` finds every
transition the engine would decide from the proposals topic.

Needs a Docker engine with the compose plugin; the images come from `make images`
(deploy/images/build: the official ones where a registry answers, else built here).
Skipped without an engine, unless RUNSTATE_REQUIRE_DOCKER=1 (CI), where it fails."""

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.broker.launcher import free_port
from processor.client.reader import RunReader
from processor.demo.driver import DemoResult, Driver
from processor.kafka.config import KafkaSettings
from processor.kafka.topics import TopicNames
from processor.trust.keyring import load_keyring, signing_keys
from schemas.messages import RunSnapshot

#: The compose stack built, scaled, killed and restarted (`make slow`, and CI).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3


def _docker_missing() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI"
    for probe in (["docker", "info"], ["docker", "compose", "version"]):
        done = subprocess.run(probe, capture_output=True, text=True, check=False, timeout=30)
        if done.returncode != 0:
            return f"`{' '.join(probe)}` failed: {(done.stderr or done.stdout).strip()[:200]}"
    return None


class Stack:
    """One compose project of this checkout, on a host port of its own."""

    def __init__(self, tmp: Path) -> None:
        self.project = f"runstate-test-{uuid.uuid4().hex[:8]}"
        self.port, self.prometheus_port = free_port(), free_port()
        self.tmp = tmp
        self.env = {
            **os.environ,
            "RUNSTATE_BROKER_HOST_PORT": str(self.port),
            "RUNSTATE_PROMETHEUS_HOST_PORT": str(self.prometheus_port),
            "COMPOSE_PROFILES": "observability",
        }
        self.env.pop("RUNSTATE_HTTP_TOKEN", None)

    def compose(self, *args: str, timeout: float = 600) -> str:
        done = subprocess.run(
            ["docker", "compose", "-p", self.project, *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        assert done.returncode == 0, f"compose {' '.join(args)}:\n{done.stdout}{done.stderr}"
        return done.stdout

    def up(self, *args: str) -> None:
        self.compose("up", "--detach", "--wait", "--scale", f"worker={WORKERS}", *args)

    def logs(self) -> str:
        try:
            return self.compose("logs", "--no-color", "--tail", "60", timeout=60)
        except AssertionError as exc:
            return str(exc)

    def worker_urls(self) -> list[str]:
        """The HTTP API of every running worker replica, on its host port."""
        listed = self.compose("ps", "--format", "json", "worker").strip()
        rows = (
            json.loads(listed)
            if listed.startswith("[")
            else [json.loads(line) for line in listed.splitlines() if line.strip()]
        )
        urls = [
            f"http://127.0.0.1:{port['PublishedPort']}"
            for row in rows
            if row.get("State") == "running"
            for port in row.get("Publishers") or []
            if port.get("TargetPort") == 8080 and port.get("PublishedPort")
        ]
        assert urls, f"no running worker publishes 8080: {listed}"
        return sorted(set(urls))

    def reader(self) -> RunReader:
        token = self.compose("exec", "-T", "--index", "1", "worker", "cat", "/http-auth/token")
        return RunReader(self.worker_urls(), http_token=token.strip())

    def keys(self) -> Path:
        """The keyring and its private keys, copied out of the setup's volume."""
        out = self.tmp / f"keys-{uuid.uuid4().hex[:6]}"
        self.compose("cp", "topics:/keys", str(out))
        return out

    def kill_worker(self, index: int) -> None:
        """`docker kill` (SIGKILL) of one worker replica's container."""
        name = f"{self.project}-worker-{index}"
        done = subprocess.run(["docker", "kill", name], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"docker kill {name}: {done.stderr}"

    def scraped_workers(self, want: int, timeout: float = 60) -> set[str]:
        """The worker instances Prometheus scrapes with health "up", once `want` are."""
        url = f"http://127.0.0.1:{self.prometheus_port}/api/v1/targets?state=active"
        deadline = time.monotonic() + timeout
        up: set[str] = set()
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    targets = json.loads(response.read())["data"]["activeTargets"]
                up = {t["labels"]["instance"] for t in targets if t["health"] == "up"}
                if len(up) >= want:
                    return up
            except OSError:
                pass  # Prometheus still starting
            time.sleep(1)
        return up

    def settings(self) -> KafkaSettings:
        return KafkaSettings(f"127.0.0.1:{self.port}")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    missing = _docker_missing()
    if missing:
        if os.environ.get("RUNSTATE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"RUNSTATE_REQUIRE_DOCKER=1 but {missing}")
        pytest.skip(f"no Docker engine with compose here: {missing}")
    images = subprocess.run(
        [str(ROOT / "deploy" / "images" / "build")],
        cwd=ROOT,
        env={**os.environ, "PYTHON": os.environ.get("PYTHON", ".venv/bin/python")},
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert images.returncode == 0, f"deploy/images/build:\n{images.stdout}{images.stderr}"
    made = Stack(tmp_path)
    try:
        yield made
    finally:
        print(made.logs())
        made.compose("down", "--volumes", "--remove-orphans", "--timeout", "5", timeout=300)


def _drive(stack: Stack, runs: int, seed: int, kill_at_wave: int | None = None) -> DemoResult:
    keys = stack.keys()
    signers = signing_keys(load_keyring(keys / "keyring.json", None), keys / "keyring.private")
    driver = Driver(stack.settings(), TopicNames.with_prefix(), signers, seed=seed, wave_timeout=90)
    killed = threading.Event()

    def on_wave(wave: int, size: int) -> None:
        if wave == kill_at_wave:
            stack.kill_worker(2)
            killed.set()

    try:
        result = driver.run(runs, on_wave=on_wave)
    finally:
        driver.close()
    assert kill_at_wave is None or killed.is_set(), "the drive ended before the kill"
    assert result.sent and not result.missing and not result.extra, (
        f"missing {result.missing[:5]}, extra {result.extra[:5]}\n{stack.logs()}"
    )
    return result


def _snapshots(stack: Stack, runs: list[str]) -> dict[str, RunSnapshot | None]:
    """Every run's snapshot from the worker that owns it; while the group settles (a
    replica joining moves partitions), no worker may own a run's partition for a while
    (421 from all): asked again, up to a minute."""
    deadline = time.monotonic() + 60
    while True:
        reader = stack.reader()
        try:
            return {run: reader.snapshot(run) for run in runs}
        except LookupError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def test_compose_stack_scaled_killed_and_restarted(stack: Stack) -> None:
    stack.up("--build")
    assert len(stack.scraped_workers(WORKERS)) == WORKERS
    first = _drive(stack, runs=45, seed=11, kill_at_wave=3)
    runs = sorted(first.final_state)
    before = _snapshots(stack, runs)
    assert all(s is not None and s.state == first.final_state[r] for r, s in before.items())

    # down keeps the named volumes (Kafka's data, the keyring): the new workers, with
    # state volumes of their own, restore every run from the changelog.
    stack.compose("down", "--timeout", "30")
    stack.up()
    assert _snapshots(stack, runs) == before
    second = _drive(stack, runs=15, seed=12)
    assert not set(second.final_state) & set(runs)

    keys = stack.keys()
    verify = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "runstate"), "verify"],
        env={
            **stack.env,
            "RUNSTATE_BOOTSTRAP_SERVERS": stack.settings().bootstrap_servers,
            "RUNSTATE_KEYRING_FILE": str(keys / "keyring.json"),
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
