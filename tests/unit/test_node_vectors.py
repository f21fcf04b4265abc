"""The second implementation of the wire format (tests/node, Node.js, written from
docs/wire.md alone) passes every conformance vector in docs/vectors, and its LZ4 reader
decodes what the lz4 tool writes: `node --test` in tests/node."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parents[2] / "tests" / "node"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def test_node_implementation_passes_the_vectors() -> None:
    assert NODE is not None
    if not (NODE_DIR / "node_modules" / "kafkajs").is_dir():
        pytest.fail(
            "tests/node/node_modules is missing: run `make tools` (npm ci --prefix tests/node)"
        )
    result = subprocess.run(
        [NODE, "--test", "vectors.test.mjs", "lz4.test.mjs"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    counts = dict(re.findall(r"^# (tests|pass|fail|todo) (\d+)$", result.stdout, re.MULTILINE))
    assert counts.get("fail") == "0", output
    assert int(counts.get("pass", "0")) >= 30, output  # every vector file was read
    # A TODO is a chain vector that differs from RFC 8785 only in floats and member order:
    # the pending move of the Python hash chain to RFC 8785, until the vectors are
    # regenerated; nothing else may be TODO.
    for line in re.findall(r"^.*# TODO .*$", result.stdout, re.MULTILINE):
        assert "pending: Python hash chain" in line, line
