"""The task alert rules: valid for Prometheus, and each fires when it should; and the
scrape config beside them is valid.

promtool comes with Debian's `prometheus` package; `make test` installs it (see the
Makefile's `tools` step) and this test fails, not skips, without it."""

import shutil
import subprocess
from pathlib import Path

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool not found: apt-get install prometheus (make tools)"
    return subprocess.run([promtool, *args], cwd=RULES, capture_output=True, text=True, timeout=60)


def test_promtool_check_rules() -> None:
    result = _promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


def test_promtool_check_scrape_config() -> None:
    # syntax only: the token file it names exists in the compose volume, not here
    result = _promtool("check", "config", "--syntax-only", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_unit_tests() -> None:
    result = _promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
