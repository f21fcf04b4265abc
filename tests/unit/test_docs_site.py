"""The manual is a docs site that builds strictly, and README.md stays a front page.

`mkdocs build --strict` turns every warning into an error: a broken link or anchor, a
page left out of the nav, a nav entry without its page (mkdocs.yml's `validation`)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.unit

#: The README's two commands, which test_demo.py and CI (.ci/run) rely on.
COMMANDS = ("make demo", "make test")
MAX_README_LINES = 250


def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, (
        f"mkdocs build --strict failed (exit {result.returncode}; the dev extra installs "
        f"mkdocs and mkdocs-material):\n{result.stdout}{result.stderr}"
    )
    assert (site / "index.html").is_file()


def test_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) < MAX_README_LINES, (
        f"README.md has {len(lines)} lines; keep it a front page under {MAX_README_LINES} "
        "and move the rest into docs/ (and mkdocs.yml's nav)"
    )
    for command in COMMANDS:
        assert command in text, f"README.md no longer shows `{command}`"
