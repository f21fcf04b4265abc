"""One configuration convention for every command: a flag and a RUNSTATE_* variable."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

ENV_PREFIX = "RUNSTATE_"


def option(*decls: str, env: str, **kwargs: Any) -> Callable[[Any], Any]:
    """A click option also read from RUNSTATE_<env>, and --help says so."""
    return click.option(*decls, envvar=ENV_PREFIX + env, show_envvar=True, **kwargs)


machine_path_option = option(
    "--machine-path",
    "machine_paths",
    env="MACHINE_PATH",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="A machine file or a folder of *.yaml machine files to load besides the built-ins "
    "(repeatable; in the environment, separate paths with ':').",
)
