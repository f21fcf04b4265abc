"""`runstate machines`: list, show, lint and diff machine definitions."""

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from processor.cli.options import KafkaContext, machine_path_option, option, pass_kafka
from processor.engine.machine import Catalog, Machine
from processor.engine.parse import MachineFileError, lint_machine_text
from processor.engine.render import mermaid, table_rows
from processor.errors import WorkerError
from processor.machine_diff import diff
from processor.machines import builtin_machines, load_catalog, load_machine_file
from processor.versions import deployed_catalog, published, version_key
from schemas.machine import MachineSpec


@click.group()
def machines() -> None:
    """Machine definitions: the built-in machines and your own files."""


def catalog(paths: tuple[Path, ...]) -> dict[str, Machine]:
    """The built-in machines and those in `paths` (--machine-path); a click error
    naming every problem of a file that does not load."""
    try:
        return load_catalog(paths)
    except MachineFileError as exc:
        raise click.ClickException(f"cannot load machines:\n{exc}") from exc


def catalog_with_versions(paths: tuple[Path, ...], kafka: KafkaContext) -> Catalog:
    """`catalog(paths)` plus every version published on the machines topic: what
    replay, verify and point-in-time reads decide each run by (its pinned version)."""
    try:
        return deployed_catalog(paths, kafka.settings, kafka.topics.machines, publish_local=False)
    except MachineFileError as exc:
        raise click.ClickException(f"cannot load machines:\n{exc}") from exc


@machines.command("publish")
@machine_path_option
@pass_kafka
def publish_machines(machine_paths: tuple[Path, ...], kafka: KafkaContext) -> None:
    """Publish the built-in machines and your files (--machine-path) as versions on the
    machines topic, so every worker and auditor holds them (a worker also publishes its
    own when it starts). Prints the <name>@<version> published, as JSON."""
    local = catalog(machine_paths)
    try:
        before = {version_key(m) for m in published(kafka.settings, kafka.topics.machines)}
        fresh = [m for m in local.values() if version_key(m) not in before]
        deployed_catalog(machine_paths, kafka.settings, kafka.topics.machines)
    except WorkerError as exc:
        raise click.ClickException(str(exc)) from exc
    print(json.dumps({"published": [version_key(m).decode() for m in fresh]}))


@machines.command("versions")
@pass_kafka
def list_versions(kafka: KafkaContext) -> None:
    """Every machine version on the machines topic, as JSON: name, version, label."""
    found = published(kafka.settings, kafka.topics.machines)
    rows = [
        {"machine": m.name, "version": m.version, "label": m.spec.label}
        for m in sorted(found, key=lambda m: (m.name, m.version))
    ]
    print(json.dumps(rows, indent=2))


@machines.command("list")
@machine_path_option
def list_machines(machine_paths: tuple[Path, ...]) -> None:
    """List loaded machines with their states."""
    table = Table("machine", "initial", "states", "terminal", "transitions")
    for name, machine in sorted(catalog(machine_paths).items()):
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
