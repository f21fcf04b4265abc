"""`runstate keys`: keyrings for workers and auditors, signing keys for producers."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from processor.cli.options import option
from processor.times import now_ms
from processor.trust import keyfiles
from processor.trust.keyfiles import KeyLimits
from processor.trust.keyring import KeyringError
from processor.trust.signatures import Algorithm

#: Every change takes effect this long after it is written, by default: longer than a
#: worker takes to read the file again (1 s), so every worker holds the change before
#: any record is decided under it, and `verify` later decides those records alike.
DEFAULT_EFFECTIVE_IN_MS = 10_000

ALGORITHMS = click.Choice([a.value for a in Algorithm])

keyring_option = option(
    "--keyring-file",
    env="KEYRING_FILE",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The keyring to change (workers read it again when it changes).",
)
effective_option = option(
    "--effective-in-ms",
    env="KEYS_EFFECTIVE_IN_MS",
    type=click.IntRange(min=0),
    default=DEFAULT_EFFECTIVE_IN_MS,
    show_default=True,
    help="The change applies to records appended this long from now, so that every "
    "worker has read it first (workers look at the file every second). 0 applies it at "
    "once: records appended before a worker reads it are still decided the old way, and "
    "`runstate verify` then reports them.",
)


@click.group()
def keys() -> None:
    """Keys: each producer signs with its own key; workers and auditors hold the keyring.

    An ed25519 key's keyring entry is its public key: whoever holds the keyring can
    verify but not sign. An hmac-sha256 key's secret is in the keyring and in the
    producer's hands alike. Keys are never removed: a revoked or expired key stays, so
    the commits it signed stay verifiable. An operator's key ("operator": true) signs
    machine versions and migrates runs: make it ed25519, so that whoever holds the
    keyring (every worker) cannot sign as the operator.
    """


@keys.command()
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--algorithm", type=ALGORITHMS, default=Algorithm.ED25519.value, show_default=True)
@click.option(
    "--private-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where each key's signing key goes as <key id>.key.json (default: OUT's "
    "directory, in <OUT stem>.private/).",
)
@click.option("--force", is_flag=True, help="Overwrite an existing keyring.")
def generate(out: Path, algorithm: str, private_dir: Path | None, force: bool) -> None:
    """Write a new keyring to OUT with one key per standard principal: runtime, tool
    (tool_executor), model, approver; an operator's key, operator (authority runtime;
    it signs machine versions and migrates runs); the workers' own key, worker
    (authority runtime, processor: give its signing key to the workers as
    --timer-key-file); and each key's signing key."""
    if out.exists() and not force:
        raise click.ClickException(f"{out} exists; use --force to replace it")
    made = keyfiles.generate(out, Algorithm(algorithm), private_dir)
    written = {k: str(path) for k, path in made.signing_keys.items()}
    click.echo(json.dumps({"keyring": str(made.keyring), "signing_keys": written}))


@keys.command()
@click.argument("key_id")
@keyring_option
@click.option("--source", required=True, help="The producer, e.g. 'approver:team-a'.")
@click.option("--authority", required=True, help="Its authority, e.g. 'approver'.")
@click.option("--algorithm", type=ALGORITHMS, default=Algorithm.ED25519.value, show_default=True)
@click.option(
    "--machine",
    "machines",
    multiple=True,
    help="Limit the key to runs of this machine (repeatable; default: any machine).",
)
@click.option(
    "--run-prefix",
    "run_prefixes",
    multiple=True,
    help="Limit the key to runs whose id starts with this (repeatable; default: any run).",
)
@click.option(
    "--operator",
    is_flag=True,
    help="An operator's key: it signs machine versions (`runstate machines publish`) "
    "and migrates runs to another version (with a machine's migrate_authorities).",
)
@click.option(
    "--processor",
    is_flag=True,
    help="A key of the workers themselves (authority runtime): it signs deadlines and "
    "the messages runs exchange (continuations); never an agent's.",
)
@click.option(
    "--valid-until-ms", type=int, default=None, help="Expiry (ms since the epoch; default: none)."
)
@click.option(
    "--private-key-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where the producer's signing key goes (default: ./<KEY_ID>.key.json, mode 0600).",
)
@effective_option
def add(
    key_id: str,
    keyring_file: Path,
    source: str,
    authority: str,
    algorithm: str,
    machines: tuple[str, ...],
    run_prefixes: tuple[str, ...],
    operator: bool,
    processor: bool,
    valid_until_ms: int | None,
    private_key_out: Path | None,
    effective_in_ms: int,
) -> None:
    """Add a key KEY_ID to the keyring (created if missing) and write its signing key."""
    limits = KeyLimits(
        not_after_ms=valid_until_ms,
        machines=machines or None,
        run_prefixes=run_prefixes or None,
        operator=operator or None,
        processor=processor or None,
    )
    with _refusals():
        added = keyfiles.add(
            keyring_file,
            key_id,
            Algorithm(algorithm),
            source,
            authority,
            not_before_ms=now_ms() + effective_in_ms,
            limits=limits,
            signing_key_out=private_key_out,
        )
    click.echo(
        json.dumps(
            {
                "added": key_id,
                "not_before_ms": added.not_before_ms,
                "signing_key": str(added.signing_key),
            }
        )
    )


@keys.command()
@click.argument("key_id")
@keyring_option
@click.option(
    "--new-key-id",
    default=None,
    help="The new key's id (default: KEY_ID with its trailing .N counted up, or .2).",
)
@click.option(
    "--overlap-ms",
    type=click.IntRange(min=0),
    default=24 * 3600 * 1000,
    show_default=True,
    help="How long the old key keeps working after the new one starts (producers "
    "switch keys in that time).",
)
@click.option(
    "--private-key-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where the new signing key goes (default: ./<new key id>.key.json, mode 0600).",
)
@effective_option
def rotate(
    key_id: str,
    keyring_file: Path,
    new_key_id: str | None,
    overlap_ms: int,
    private_key_out: Path | None,
    effective_in_ms: int,
) -> None:
    """Replace KEY_ID by a new key with the same principal and scope: the new key starts
    after --effective-in-ms, the old one expires --overlap-ms after that."""
    with _refusals():
        rotated = keyfiles.rotate(
            keyring_file,
            key_id,
            not_before_ms=now_ms() + effective_in_ms,
            overlap_ms=overlap_ms,
            new_key_id=new_key_id,
            signing_key_out=private_key_out,
        )
    click.echo(
        json.dumps(
            {
                "rotated": key_id,
                "new_key_id": rotated.new_key_id,
                "not_before_ms": rotated.not_before_ms,
                "old_not_after_ms": rotated.old_not_after_ms,
                "signing_key": str(rotated.signing_key),
            }
        )
    )


@keys.command()
@click.argument("key_id")
@keyring_option
@effective_option
def revoke(key_id: str, keyring_file: Path, effective_in_ms: int) -> None:
    """Revoke KEY_ID: records appended from the revocation on are refused
    (unauthenticated); what it signed before stays verifiable."""
    at = now_ms() + effective_in_ms
    with _refusals():
        keyfiles.revoke(keyring_file, key_id, at)
    click.echo(json.dumps({"revoked": key_id, "revoked_at_ms": at}))


@keys.command("list")
@keyring_option
def list_keys(keyring_file: Path) -> None:
    """Print the keyring's keys as JSON: principal, validity, scope; never a secret."""
    with _refusals():
        keyring = keyfiles.read_keyring(keyring_file)
    click.echo(json.dumps({"keys": keyfiles.key_listing(keyring, now_ms())}, indent=2))


@contextmanager
def _refusals() -> Iterator[None]:
    """A keyring that does not load, or a change it refuses: a click error saying why."""
    try:
        yield
    except KeyringError as exc:
        raise click.ClickException(str(exc)) from exc
