"""One configuration convention: a setting is declared once, as a field of a settings
model, and is at the same time a RUNSTATE_<NAME> environment variable, a default and a
command-line flag (--<name-with-dashes>, unless a `Flag` spells it otherwise).

pydantic-settings reads the environment and validates; the CLI derives its flags from the
same fields (processor/cli/flags.py), and a flag given wins over the environment.
"""

from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "RUNSTATE_"


class Flag:
    """How a setting is spelled on the command line when --<name-with-dashes> does not say
    it well: other spellings (`Flag("--peer")`, `Flag("--on/--off")`), and for paths
    whether they must exist when given."""

    def __init__(self, *decls: str, exists: bool = False) -> None:
        self.decls = decls
        self.exists = exists


class NotAFlag:
    """A setting a library caller may give but the command line does not offer."""


class Settings(BaseSettings):
    """The base of every settings model: RUNSTATE_* variables, immutable once read."""

    # An empty variable counts as unset (as click has it for the flags' variables).
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_ignore_empty=True, frozen=True, extra="forbid"
    )


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def split_list(value: Any, separator: str) -> Any:
    """A variable's list (`a,b` or `a:b`) as a tuple; flags' tuples pass through."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(separator) if item.strip())
    return value


def existing_paths(paths: tuple[Path, ...]) -> tuple[Path, ...]:
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        raise ValueError(f"no such file or folder: {', '.join(missing)}")
    return paths
