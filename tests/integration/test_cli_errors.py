"""Mistakes a person makes with the CLI on a real broker end in one line that says what
is wrong and what to do, with a non-zero exit, never a traceback."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from processor.kafka.topics import TopicNames
from processor.trust.keyring import dump_signing_key
from tests.integration.harness import ROOT, Env, make_env


@pytest.fixture
def env(kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path) -> Env:
    return make_env(kafka_bootstrap, topic_names, tmp_path)


def _runstate(env: Env, *args: str, prefix: str) -> subprocess.CompletedProcess[str]:
    key = env.tmp / "runtime.key.json"
    key.write_text(dump_signing_key(env.signing_key("runtime")))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RUNSTATE_")}
    clean.update(
        RUNSTATE_BOOTSTRAP_SERVERS=env.bootstrap,
        RUNSTATE_TOPIC_PREFIX=prefix,
        RUNSTATE_SIGNING_KEY_FILE=str(key),
        RUNSTATE_KEYRING_FILE=str(env.keyring_path),
    )
    return subprocess.run(
        [sys.executable, "-m", "processor.cli.main", *args],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("create", "r1", "task_lifecycle"),
        ("propose", "r1", "start"),
        ("tail", "--limit", "1"),
        ("verify",),
        ("replay", "--state-dir", "{tmp}/state"),
    ],
)
def test_a_topic_prefix_with_no_topics_is_one_line(env: Env, args: tuple[str, ...]) -> None:
    """A reachable cluster without the topics (a new one, or a wrong prefix): one line,
    within seconds."""
    prefix = f"nope-{uuid.uuid4().hex[:6]}."
    began = time.monotonic()
    done = _runstate(env, *(a.format(tmp=env.tmp) for a in args), prefix=prefix)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{prefix}" in lines[0] and "runstate topics create" in lines[0], lines[0]
    assert time.monotonic() - began < 10


def test_a_run_id_no_topic_could_carry_is_a_usage_error(env: Env) -> None:
    prefix = env.topics.proposals.removesuffix("proposals")
    done = _runstate(env, "create", "a\x01b", "task_lifecycle", prefix=prefix)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "invalid proposal: run_id: " in done.stderr and "Traceback" not in done.stderr
