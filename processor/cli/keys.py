"""`runstate keys`: keyrings for workers and producers."""

from pathlib import Path

import click

from processor.keyring import dump_keyring, generate_keyring


@click.group()
def keys() -> None:
    """HMAC keys: each producer signs with its own key id; workers hold the keyring."""


@keys.command()
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def generate(out: Path, force: bool) -> None:
    """Write a new keyring to OUT with one key per standard principal:
    runtime, tool (tool_executor), model, approver."""
    if out.exists() and not force:
        raise click.ClickException(f"{out} exists; use --force to replace it")
    out.write_text(dump_keyring(generate_keyring()))
    out.chmod(0o600)
    click.echo(f"wrote {out} (keys: runtime, tool, model, approver)")
