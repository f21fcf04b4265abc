"""The benchmark command runs end to end (smoke size): every contender asked for is
measured and the report is written. Figures are not judged here; BENCHMARKS.md is."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.harness import ROOT

#: The benchmark command end to end: a minute and more (`make slow`, and CI).
pytestmark = pytest.mark.slow


def test_benchmark_command_writes_every_figure(kafka_bootstrap: str, tmp_path: Path) -> None:
    out_md, out_json = tmp_path / "BENCHMARKS.md", tmp_path / "results.json"
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.pipeline",
            "--quick",
            "--contenders",
            "native,ceiling,sqlite",
            "--loads",
            "0.2",
            "--growth",
            "300,600",
            "--ceiling-scale",
            "2",
            "--markdown",
            str(out_md),
            "--json",
            str(out_json),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(out_json.read_text())
    # Every contender on Ed25519-signed input, and the native worker on HMAC-signed input.
    assert set(results["throughput"]) == {"native", "ceiling", "sqlite", "native · HMAC"}
    for row in results["throughput"].values():
        assert row["rate"]["min"] > 0 and row["peak_mb"]["min"] > 0
        assert row["cpu_us_per_proposal"]["min"] > 0
    measured = {t["target"]: t for t in results["targets"] if t["value"] is not None}
    assert any("HMAC-signed proposal" in target for target in measured)
    assert any("Ed25519-signed proposal" in target for target in measured)
    (load,) = results["latency"]
    for row in load["contenders"].values():
        assert row["missing"] == 0 and 0 < row["p50_ms"] <= row["p99_ms"]
    assert set(results["growth"]["resident_mb"]) == {"300", "600"}
    assert results["growth"]["restore_runs_per_s"] > 0
    assert 0.05 < results["parameters"]["refused_share"] < 0.5
    text = out_md.read_text()
    assert "## Throughput targets" in text and "sqlite" in text and "CPU µs a proposal" in text
    assert results["parameters"]["ceiling_scale"] == 2 and "The ceiling drains 2 times" in text
