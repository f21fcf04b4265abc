"""The Quix Streams peer's own environment: Quix Streams pins confluent-kafka < 2.13 and
pydantic < 2.14, so it gets a venv of its own (created once, in the cache) and the
product's pins stay free."""

import subprocess
import sys
from pathlib import Path

from rich.console import Console

from processor.broker.launcher import cache_root

QUIX = "quixstreams==3.28.1"
# What the project's modules the peer imports need besides what Quix brings.
EXTRA = ("PyYAML>=6.0",)


def quix_python(console: Console) -> Path:
    """The venv's python, created (with `QUIX` installed) if it is not there yet."""
    venv = cache_root() / "bench" / f"venv-{QUIX.replace('==', '-')}"
    python = venv / "bin" / "python"
    if python.exists():
        return python
    with console.status(f"Creating the Quix Streams peer's environment ({QUIX}) in {venv}"):
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", QUIX, *EXTRA],
            check=True,
        )
    return python
