"""A second implementation of the wire format against the Python worker, on a real broker.

tests/node (Node.js, written from docs/wire.md alone) signs proposals with an Ed25519
agent key; the Python worker commits them; the Node verifier and `runstate verify` (with
a keyring of public keys only) both pass the transitions topic; after a forged record is
appended, both fail and name the same record.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer

from processor.kafka.config import KafkaSettings
from processor.kafka.readback import read_partitions
from processor.kafka.topics import TopicNames
from processor.trust.keyring import load_keyring
from tests.integration.harness import (
    ROOT,
    Env,
    WorkerProcess,
    published,
    runstate,
    wait_for_outcomes,
)

NODE_DIR = ROOT / "tests" / "node"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")

PLAIN = "node-ü-😀-𝄞"  # a run whose values hash alike before and after RFC 8785
FLOATS = "node-rfc8785"  # floats and keys whose order differs by UTF-16 / code point
APPROVAL = "node/run_state-1"
TEXT = '<tag> & "quotes" \\ / \u2028 \u007f \u0001 é 😀 𝄞'

#: One proposal per line, sent byte for byte by the Node producer. `ascii` lines escape
#: every non-ASCII character (surrogate pairs for the astral plane): another encoding
#: of the same value.
PLAN: list[tuple[dict[str, Any], bool]] = [
    (
        {
            "run_id": PLAIN,
            "proposal_id": "plain-0",
            "event": "create",
            "payload": {"machine": "task_lifecycle"},
            "metadata": {"text": TEXT, "max": 9007199254740991, "min": -9007199254740991},
        },
        False,
    ),
    (
        {
            "run_id": APPROVAL,
            "proposal_id": "approval-0",
            "event": "create",
            "payload": {"machine": "run_state"},
        },
        True,
    ),
    (
        {
            "run_id": PLAIN,
            "proposal_id": "plain-1",
            "event": "start",
            "expected_revision": 0,
            "metadata": {"ünï": "😀", "a": 1, "B": [None, True, False, [], {}], "é": {"": ""}},
        },
        True,
    ),
    (
        {
            "run_id": FLOATS,
            "proposal_id": "floats-0",
            "event": "create",
            "payload": {"machine": "task_lifecycle"},
            "metadata": {"keys": {"\ue000": 1, "😀": 2, "a": 3, "B": 4, "é": 5}},
        },
        False,
    ),
    ({"run_id": APPROVAL, "proposal_id": "approval-1", "event": "start"}, False),
    (
        {
            "run_id": FLOATS,
            "proposal_id": "floats-1",
            "event": "start",
            "metadata": {
                "ratio": 1.0,
                "tiny": 1e-7,
                "big": 1e21,
                "neg_zero": -0.0,
                "third": 1 / 3,
                "text": TEXT,
            },
        },
        False,
    ),
    ({"run_id": APPROVAL, "proposal_id": "approval-2", "event": "need_approval"}, False),
    ({"run_id": PLAIN, "proposal_id": "plain-2", "event": "complete"}, False),
]


def node(*args: str) -> subprocess.CompletedProcess[str]:
    assert NODE is not None
    if not (NODE_DIR / "node_modules" / "kafkajs").is_dir():
        pytest.fail(
            "tests/node/node_modules is missing: run `make tools` (npm ci --prefix tests/node)"
        )
    return subprocess.run(
        [NODE, *args], cwd=NODE_DIR, capture_output=True, text=True, timeout=120, check=False
    )


def add_key(keyring: Path, key_id: str, source: str, authority: str, out: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RUNSTATE_")}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "processor.cli.main",
            "keys",
            "add",
            key_id,
            "--keyring-file",
            str(keyring),
            "--source",
            source,
            "--authority",
            authority,
            "--algorithm",
            "ed25519",
            "--private-key-out",
            str(out),
            "--effective-in-ms",
            "0",
        ],
        cwd=ROOT,
        env=clean,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )


def node_verify(env: Env) -> tuple[int, dict[str, Any]]:
    result = node("verify.mjs", "--bootstrap", env.bootstrap, "--topic", env.topics.transitions)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return result.returncode, json.loads(result.stdout)


def python_verify(env: Env) -> tuple[int, set[tuple[int, int]], str]:
    result = runstate(env, "verify", "--keyring-file", str(env.keyring_path))
    assert result.returncode in (0, 1), result.stdout + result.stderr
    found = re.findall(r"transitions partition (\d+), offset (\d+)", result.stdout)
    return result.returncode, {(int(p), int(o)) for p, o in found}, result.stdout


def test_node_signs_python_commits_and_both_verifiers_agree(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    keyring_path = tmp_path / "keyring.json"
    add_key(keyring_path, "runtime", "runtime", "runtime", tmp_path / "runtime.key.json")
    add_key(keyring_path, "agent-node", "agent:node", "runtime", tmp_path / "agent.key.json")
    keyring_text = keyring_path.read_text()
    assert "private_key" not in keyring_text and "secret" not in keyring_text  # public only
    env = Env(
        kafka_bootstrap, topic_names, load_keyring(keyring_path, None), keyring_path, tmp_path
    )

    proposals = tmp_path / "proposals.jsonl"
    proposals.write_text(
        "".join(json.dumps(p, ensure_ascii=ascii) + "\n" for p, ascii in PLAN), encoding="utf-8"
    )
    worker = WorkerProcess(
        env, tmp_path / "w1", "--timer-key-file", str(tmp_path / "runtime.key.json")
    )
    try:
        worker.wait_ready(partitions=3)
        produced = node(
            "produce.mjs",
            "--bootstrap",
            env.bootstrap,
            "--topic",
            env.topics.proposals,
            "--signing-key",
            str(tmp_path / "agent.key.json"),
            "--proposals",
            str(proposals),
        )
        assert produced.returncode == 0, produced.stdout + produced.stderr
        assert json.loads(produced.stdout) == {"sent": len(PLAN)}
        plan = [p for p, _ in PLAN]
        result = wait_for_outcomes(env, plan, timeout=30)
    finally:
        assert worker.terminate() == 0, worker.log()

    # every proposal committed, none refused, with the agent's principal and its values
    assert [(r.proposal_id, r.code.value, r.detail) for r in result.rejections] == []
    assert result.dead_letters == 0
    committed = {t.proposal_id: t for t in result.transitions}
    assert sorted(committed) == sorted(p["proposal_id"] for p in plan)
    for p in plan:
        t = committed[p["proposal_id"]]
        assert (t.run_id, t.event) == (p["run_id"], p["event"])
        assert (t.principal.source, t.principal.authority) == ("agent:node", "runtime")
        assert t.metadata == p.get("metadata", {})
    assert committed["plain-2"].to_state == "done"
    assert committed["approval-2"].to_state == "waiting_approval"

    # both verifiers pass the same topic
    code, clean = node_verify(env)
    assert (clean["transitions"], clean["runs"]) == (len(plan), 3), clean
    assert code == 0 and clean["problems"] == [], clean
    py_code, py_found, py_out = python_verify(env)
    assert py_code == 0 and "every chain is intact" in py_out, py_out

    # someone with write access appends a forged copy of PLAIN's last transition: another
    # to_state, the old hashes, in the run's own partition, outside any transaction
    partitions = read_partitions(KafkaSettings(env.bootstrap), env.topics.transitions)
    partition, last = next(
        (p, r)
        for p, records in partitions.items()
        for r in records
        if r.key == PLAIN.encode() and json.loads(r.value or b"{}").get("proposal_id") == "plain-2"
    )
    forged = json.loads(last.value or b"{}")
    forged["to_state"] = "failed"
    delivered: list[tuple[int, int]] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        delivered.append((msg.partition() or 0, msg.offset() or 0))

    producer = Producer({"bootstrap.servers": env.bootstrap})
    producer.produce(
        env.topics.transitions,
        key=PLAIN.encode(),
        value=json.dumps(forged, ensure_ascii=False).encode(),
        partition=partition,
        on_delivery=on_delivery,
    )
    assert producer.flush(30) == 0
    [forged_at] = delivered

    code, tampered = node_verify(env)
    assert code == 1, tampered
    flagged = {(p["partition"], p["offset"], p["run_id"]) for p in tampered["problems"]}
    assert flagged == {(*forged_at, PLAIN)}, tampered
    assert {p["problem"] for p in tampered["problems"]} >= {"hash", "prev_hash"}
    py_code, py_found, py_out = python_verify(env)
    assert py_code == 1, py_out
    assert py_found == {forged_at}, py_out
    assert f"{PLAIN}:2" in py_out, py_out
    assert len(published(env).transitions) == len(plan) + 1
