"""`runstate machines`: list, show and lint machine definitions."""

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from processor.cli.options import machine_path_option
from processor.engine.machine import Machine
from processor.engine.parse import MachineFileError, lint_machine_text
from processor.engine.render import mermaid, table_rows
from processor.machines import load_catalog


@click.group()
def machines() -> None:
    """Machine definitions: the built-in seed machines and your own files."""


def catalog(paths: tuple[Path, ...]) -> dict[str, Machine]:
    """The built-in machines and those in `paths` (--machine-path); a click error
    naming every problem of a file that does not load."""
    try:
        return load_catalog(paths)
    except MachineFileError as exc:
        raise click.ClickException(f"cannot load machines:\n{exc}") from exc


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
