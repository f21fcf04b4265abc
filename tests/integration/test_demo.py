"""The README's demo command, end to end on the fixture's broker."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_gives_every_proposal_exactly_one_outcome(kafka_bootstrap: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNSTATE_")}
    env["COLUMNS"] = "160"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "processor.cli.main",
            "demo",
            "--runs",
            "60",
            "--workers",
            "2",
            "--partitions",
            "3",
            "--bootstrap-servers",
            kafka_bootstrap,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "every proposal got exactly one outcome" in out
    assert "missing 0, more than one outcome 0, duplicate transition ids 0" in out.replace(
        "\n", " "
    )
    for needle in ("task_lifecycle", "owned_run", "run_state", "rejected: unauthenticated"):
        assert needle in out
