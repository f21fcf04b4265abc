"""Keyrings: key id -> HMAC secret and the principal (source, authority) it proves.

A worker loads one from a JSON file (RUNSTATE_KEYRING_FILE) or from JSON text in the
environment (RUNSTATE_KEYRING). Each producer holds only its own key.
"""

import json
import secrets
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.base import describe_errors


class KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    secret: str = Field(min_length=16, description="Shared HMAC-SHA256 secret.")
    source: str = Field(min_length=1)
    authority: str = Field(min_length=1)


class Keyring(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    keys: dict[str, KeyEntry]


class KeyringError(ValueError):
    pass


def parse_keyring(text: str, origin: str) -> Keyring:
    try:
        return Keyring.model_validate_json(text)
    except ValidationError as exc:
        raise KeyringError(
            f"{origin} is not a keyring ({describe_errors(exc)}); expected "
            '{"keys": {"<key id>": {"secret": "...", "source": "...", "authority": "..."}}}'
        ) from exc


def load_keyring(path: Path | None, text: str | None) -> Keyring:
    """From a file if given, else from JSON text; one of them is required."""
    if path is not None:
        try:
            return parse_keyring(path.read_text(encoding="utf-8"), str(path))
        except OSError as exc:
            raise KeyringError(f"cannot read keyring {path}: {exc.strerror}") from exc
    if text:
        return parse_keyring(text, "RUNSTATE_KEYRING")
    raise KeyringError(
        "no keyring: give --keyring-file (RUNSTATE_KEYRING_FILE) or RUNSTATE_KEYRING; "
        "`runstate keys generate` writes one"
    )


#: The principals of the seeds (002: runtime, tool executor, model; 003: approver).
STANDARD_PRINCIPALS = {
    "runtime": ("runtime", "runtime"),
    "tool": ("tool:get_status", "tool_executor"),
    "model": ("model:planner", "model"),
    "approver": ("approver:oncall", "approver"),
}


def generate_keyring() -> Keyring:
    """A fresh keyring with one key per standard principal (key id = its name)."""
    return Keyring(
        keys={
            key_id: KeyEntry(secret=secrets.token_hex(32), source=source, authority=authority)
            for key_id, (source, authority) in STANDARD_PRINCIPALS.items()
        }
    )


def dump_keyring(keyring: Keyring) -> str:
    return json.dumps(keyring.model_dump(), indent=2) + "\n"
