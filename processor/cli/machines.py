"""`runstate machines`: list, show, lint and diff machine definitions."""

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from processor.cli.options import (
    KafkaContext,
    keyring_file_option,
    machine_path_option,
    option,
    pass_kafka,
)
from processor.engine.machine import Catalog
from processor.engine.parse import MachineFileError, lint_machine_text
from processor.engine.render import mermaid, table_rows
from processor.history.machine_diff import diff
from processor.history.versions import (
    RefusedVersion,
    held_versions,
    load_operator_key,
    publish,
    published,
    trusted_catalog,
)
from processor.machines import builtin_machines, load_catalog, load_machine_file
from processor.runtimes.errors import WorkerError
from processor.trust.keygen import OPERATOR_KEY_ID
from processor.trust.keyring import Keyring, KeyringError, load_keyring
from schemas.machine import MachineSpec


@click.group()
def machines() -> None:
    """Machine definitions: the built-in machines and your own files."""


def catalog(paths: tuple[Path, ...]) -> Catalog:
    """The built-in machines and those in `paths` (--machine-path); a click error
    naming every problem of a file that does not load."""
    try:
        return load_catalog(paths)
    except MachineFileError as exc:
        raise click.ClickException(f"cannot load machines:\n{exc}") from exc


def optional_keyring(keyring_file: Path | None) -> Keyring | None:
    """The keyring given (--keyring-file or RUNSTATE_KEYRING), or None."""
    if keyring_file is None and not os.environ.get("RUNSTATE_KEYRING"):
        return None
    try:
        return load_keyring(keyring_file, os.environ.get("RUNSTATE_KEYRING"))
    except KeyringError as exc:
        raise click.ClickException(str(exc)) from exc


def versions_and_refusals(
    paths: tuple[Path, ...], kafka: KafkaContext, keyring: Keyring | None
) -> tuple[Catalog, list[RefusedVersion]]:
    """`catalog(paths)` plus every version on the machines topic that takes effect (an
    operator signed it, checked with `keyring`; without one, only the versions held
    here): what replay, verify and point-in-time reads decide each run by (its pinned
    version); and the records refused."""
    try:
        machines, found = trusted_catalog(paths, kafka.settings, kafka.topics.machines, keyring)
    except MachineFileError as exc:
        raise click.ClickException(f"cannot load machines:\n{exc}") from exc
    return machines, found.refused


def catalog_with_versions(
    paths: tuple[Path, ...], kafka: KafkaContext, keyring: Keyring | None
) -> Catalog:
    """`versions_and_refusals`, each refusal named on stderr."""
    machines, refused = versions_and_refusals(paths, kafka, keyring)
    for refusal in refused:
        click.echo(f"machine version refused, not used: {refusal}", err=True)
    return machines


@machines.command("publish")
@machine_path_option
@pass_kafka
@keyring_file_option
@option(
    "--key-id",
    env="KEY_ID",
    default=OPERATOR_KEY_ID,
    show_default=True,
    help="The operator's HMAC key of the keyring that signs; --signing-key-file instead "
    "for an ed25519 key.",
)
@option(
    "--signing-key-file",
    env="SIGNING_KEY_FILE",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="An operator's signing key (`runstate keys add KEY_ID --operator` writes one). "
    "Used instead of --key-id.",
)
def publish_machines(
    machine_paths: tuple[Path, ...],
    kafka: KafkaContext,
    keyring_file: Path | None,
    key_id: str,
    signing_key_file: Path | None,
) -> None:
    """Sign with an operator's key and publish the built-in machines and your files
    (--machine-path) as versions on the machines topic, so every worker and auditor
    holds them (a worker given an operator's key publishes its own when it starts).
    Workers use only versions an operator signed. Needs the keyring (--keyring-file or
    RUNSTATE_KEYRING). Prints the <name>@<version> published, as JSON."""
    local = catalog(machine_paths)
    keyring = optional_keyring(keyring_file)
    if keyring is None:
        raise click.ClickException(
            "no keyring: give --keyring-file (RUNSTATE_KEYRING_FILE) or RUNSTATE_KEYRING, "
            "the one the workers hold"
        )
    try:
        signer = load_operator_key(keyring, None if signing_key_file else key_id, signing_key_file)
        fresh = publish(
            kafka.settings,
            kafka.topics.machines,
            local.values(),
            signer,
            keyring,
            held_versions(local),
        )
    except WorkerError as exc:
        raise click.ClickException(str(exc)) from exc
    print(json.dumps({"published": fresh}))


@machines.command("versions")
@pass_kafka
def list_versions(kafka: KafkaContext) -> None:
    """Every machine version on the machines topic, as JSON: name, version, label; as
    published, signed or not (workers use only those an operator signed)."""
    found = published(kafka.settings, kafka.topics.machines)
    rows = [
        {"machine": m.name, "version": m.version, "label": m.spec.label}
        for m in sorted(found, key=lambda m: (m.name, m.version))
    ]
    print(json.dumps(rows, indent=2))


@machines.command("list")
@machine_path_option
@option(
    "--json",
    "as_json",
    env="MACHINES_LIST_JSON",
    is_flag=True,
    help="Print a JSON list of {machine, initial, states, terminal, transitions}.",
)
def list_machines(machine_paths: tuple[Path, ...], as_json: bool) -> None:
    """List loaded machines with their states."""
    loaded = sorted(catalog(machine_paths).items())
    if as_json:
        rows = [
            {
                "machine": name,
                "initial": m.spec.initial,
                "states": list(m.spec.states),
                "terminal": list(m.spec.terminal),
                "transitions": len(m.spec.transitions),
            }
            for name, m in loaded
        ]
        click.echo(json.dumps(rows))
        return
    table = Table("machine", "initial", "states", "terminal", "transitions")
    for name, machine in loaded:
        spec = machine.spec
        table.add_row(
            name,
            spec.initial,
            ", ".join(spec.states),
            ", ".join(spec.terminal),
            str(len(spec.transitions)),
        )
    Console().print(table)


@machines.command("show")
@click.argument("name")
@machine_path_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "mermaid", "both"]),
    default="both",
    help="Print the transition table, the Mermaid state diagram, or both.",
)
def show(name: str, machine_paths: tuple[Path, ...], fmt: str) -> None:
    """Print machine NAME's transition table and a Mermaid state diagram."""
    loaded = catalog(machine_paths)
    machine = loaded.get(name)
    if machine is None:
        raise click.ClickException(f"no machine '{name}'; loaded: {', '.join(sorted(loaded))}")
    spec = machine.spec
    if fmt in ("table", "both"):
        console = Console()
        console.print(f"[bold]{spec.name}[/bold]: {spec.description}")
        console.print(
            f"initial: {spec.initial}   terminal: {', '.join(spec.terminal)}   "
            f"steps in: {', '.join(spec.step_states) or '-'}"
        )
        if spec.retry is not None:
            console.print(
                f"retry: '{spec.retry.event}' spends the budget (default "
                f"{spec.retry.default_max_retries}); then '{spec.retry.exhausted_event}'"
            )
        table = Table("from", "event", "to", "who may send", "conditions")
        for row in table_rows(machine):
            table.add_row(*row)
        console.print(table)
    if fmt == "mermaid":
        click.echo(mermaid(machine), nl=False)
    elif fmt == "both":  # fenced, so the output pastes into Markdown as a diagram
        click.echo(f"```mermaid\n{mermaid(machine)}```")


@machines.command("lint")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
def lint_files(files: tuple[Path, ...]) -> None:
    """Check machine FILES; print `file:line: problem` for each issue, exit 1 if any."""
    failed = False
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            click.echo(f"{path}: cannot read: {exc.strerror}", err=True)
            failed = True
            continue
        problems = lint_machine_text(text, str(path))
        for problem in problems:
            click.echo(problem, err=True)
        if problems:
            failed = True
        else:
            click.echo(f"{path}: ok")
    sys.exit(1 if failed else 0)


def _load_for_diff(which: str) -> MachineSpec:
    """A machine file, or the name of a built-in machine; exit 2 when it does not load."""
    path = Path(which)
    builtins = builtin_machines()
    try:
        if not path.exists() and which in builtins:
            return builtins[which].spec
        return load_machine_file(path).spec
    except MachineFileError as exc:
        click.echo(f"cannot load {which}:\n{exc}", err=True)
        sys.exit(2)


@machines.command("diff")
@click.argument("old")
@click.argument("new")
@option(
    "--json",
    "as_json",
    env="MACHINES_DIFF_JSON",
    is_flag=True,
    help="Print the changes as a JSON list.",
)
def diff_machines(old: str, new: str, as_json: bool) -> None:
    """Name every change from machine OLD to NEW and whether it breaks runs in flight.

    OLD and NEW are machine files (or names of built-in machines). A change is breaking
    when a run created under OLD, then decided under NEW, could get stuck or be decided
    differently: a state, event or transition removed, a transition retargeted, an
    initial or terminal state changed, an event's authorities or sources narrowed, a
    guard added or tightened, a reason required where none was, a timeout removed or
    changed, the retry policy changed, create or step authorities narrowed, the dedupe
    window shrunk. Additions and widenings are compatible.

    Prints a table (--json: a list of {impact, kind, subject, description, breaking}).
    Exit status: 0 when no change is breaking (also when nothing changed), 1 when any
    is, 2 when a file does not load.
    """
    changes = diff(_load_for_diff(old), _load_for_diff(new))
    breaking = sum(1 for c in changes if c.breaking)
    if as_json:
        click.echo(json.dumps([c.as_dict() for c in changes], indent=2))
    elif not changes:
        click.echo("no changes")
    else:
        table = Table("impact", "kind", "change")
        for change in changes:
            style = "red" if change.breaking else "green"
            table.add_row(f"[{style}]{change.impact}[/]", change.kind, change.description)
        console = Console()
        console.print(table)
        console.print(f"{breaking} breaking, {len(changes) - breaking} compatible")
    sys.exit(1 if breaking else 0)
