"""The Quix Streams peer's own environment: Quix Streams pins confluent-kafka < 2.13 and
pydantic < 2.14, so it gets a venv of its own (created once, in the cache) and the
product's pins stay free."""

import subprocess
import sys
from pathlib import Path

from rich.console import Console

from processor.broker.launcher import cache_root

QUIX = "quixstreams==3.28.1"
# What the project's modules the peer imports need besides what Quix brings, with the
# module each gives: installed into a venv created before one of them was needed, too.
# PyNaCl: the peer verifies Ed25519 signatures with libsodium, as the worker does.
EXTRA = {
    "PyYAML>=6.0": "yaml",
    "rfc8785>=0.1.4": "rfc8785",
    "orjson>=3.9": "orjson",
    "PyNaCl>=1.5": "nacl",
}


def quix_python(console: Console) -> Path:
    """The venv's python, created (with `QUIX` installed) if it is not there yet, and
    given `EXTRA` if it lacks any."""
    venv = cache_root() / "bench" / f"venv-{QUIX.replace('==', '-')}"
    python = venv / "bin" / "python"
    if not python.exists():
        with console.status(f"Creating the Quix Streams peer's environment ({QUIX}) in {venv}"):
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", QUIX, *EXTRA],
                check=True,
            )
    else:
        probe = [str(python), "-c", f"import {', '.join(EXTRA.values())}"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            return python
        with console.status(f"Adding {', '.join(EXTRA)} to the Quix Streams peer's {venv}"):
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", *EXTRA], check=True)
    return python
