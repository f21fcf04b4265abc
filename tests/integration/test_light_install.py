"""The light install for real: a fresh venv, `pip install <this tree>` with no
extras (from the package index, about 10 s), then the SDK imports, a light command runs,
and a worker command names the extra. No broker needed."""

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: One process builds the venv once for every test here (the build takes ~25 s).
pytestmark = pytest.mark.xdist_group("light_install")


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding `pip install runstate` built from a copy of this tree (what the
    Dockerfile copies), so the build leaves nothing in the working tree."""
    base = tmp_path_factory.mktemp("light")
    source = base / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("processor", "schemas"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pip.returncode == 0, (
        "pip could not install runstate into a fresh venv (is the package index "
        f"reachable? see pip's output):\n{pip.stdout[-2000:]}{pip.stderr[-3000:]}"
    )
    return venv


def _run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Outside the tree (cwd) and without PYTHONPATH: only what was installed is seen.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_the_light_install_leaves_the_worker_out(light_venv: Path, tmp_path: Path) -> None:
    listed = _run(light_venv, "python", "-m", "pip", "list", "--format=json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert "runstate" in installed
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    worker = {
        re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower()  # type: ignore[union-attr]
        for requirement in project["optional-dependencies"]["worker"]
    }
    assert {"rocksdict", "faust-streaming", "testcontainers"} <= worker
    assert installed & worker == set()


def test_the_sdk_imports_in_the_light_install(light_venv: Path, tmp_path: Path) -> None:
    result = _run(
        light_venv,
        "python",
        "-c",
        "from processor.client import RunstateClient; import schemas; import processor.client;"
        "assert processor.client.__file__.startswith(__import__('sys').prefix), "
        "processor.client.__file__",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr


def test_light_commands_run_and_worker_commands_name_the_extra(
    light_venv: Path, tmp_path: Path
) -> None:
    keys = _run(
        light_venv, "runstate", "keys", "generate", str(tmp_path / "keys.json"), cwd=tmp_path
    )
    assert keys.returncode == 0, keys.stdout + keys.stderr
    assert (tmp_path / "keys.json").exists()
    for command in ("propose", "create", "get", "history", "verify"):
        shown = _run(light_venv, "runstate", command, "--help", cwd=tmp_path)
        assert shown.returncode == 0, f"runstate {command} --help: {shown.stderr}"
    for command in ("worker", "demo", "replay"):
        helped = _run(light_venv, "runstate", command, "--help", cwd=tmp_path)
        assert helped.returncode == 0, helped.stdout + helped.stderr  # help is no error
        assert "pip install 'runstate[worker]'" in helped.stdout
        refused = _run(light_venv, "runstate", command, cwd=tmp_path)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "pip install 'runstate[worker]'" in refused.stderr
