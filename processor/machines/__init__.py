"""The machine catalog: the built-in machines shipped with runstate plus users' machine files."""

from collections.abc import Iterable
from functools import cache
from importlib import resources
from pathlib import Path

from processor.engine.machine import Catalog, Machine
from processor.engine.parse import MachineFileError, parse_machine

BUILTIN_NAMES = ("run_state", "owned_run", "task_lifecycle")


@cache
def builtin_machines() -> dict[str, Machine]:
    """The three built-in machines, parsed and linted once per process."""
    folder = resources.files(__package__)
    machines = {}
    for name in BUILTIN_NAMES:
        text = folder.joinpath(f"{name}.yaml").read_text(encoding="utf-8")
        machines[name] = parse_machine(text, f"{name}.yaml")
    return machines


@cache
def builtin_history() -> tuple[Machine, ...]:
    """Every earlier version of the built-in machines, shipped in `history/` as
    `<name>@<version>.yaml`: runs pinned to one keep being decided after an upgrade,
    from the package itself (trusted as the deployed code is, unsigned). Whoever
    changes a built-in machine copies its new file there too."""
    folder = resources.files(__package__).joinpath("history")
    machines = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            text = entry.read_text(encoding="utf-8")
            machines.append(parse_machine(text, f"history/{entry.name}"))
    return tuple(machines)


def builtin_source(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")


def load_machine_file(path: Path) -> Machine:
    """Parse and lint one user machine file; errors name the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MachineFileError([f"{path}: cannot read: {exc.strerror}"]) from exc
    return parse_machine(text, str(path))


def load_catalog(paths: Iterable[Path] = (), older: Iterable[Machine] = ()) -> Catalog:
    """Built-in machines plus the given files (or every *.yaml in a given folder): the
    versions new runs get; the built-ins' earlier versions and `older` ones (e.g. from
    the machines topic) decide the runs pinned to them."""
    catalog = Catalog(builtin_machines().values(), (*builtin_history(), *older))
    for path in paths:
        files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        for file in files:
            machine = load_machine_file(file)
            if machine.name in catalog:
                raise MachineFileError(
                    [f"{file}:1: name: machine '{machine.name}' is already defined; rename it"]
                )
            catalog[machine.name] = machine
            catalog.add_version(machine)
    return catalog


__all__ = [
    "BUILTIN_NAMES",
    "MachineFileError",
    "builtin_history",
    "builtin_machines",
    "builtin_source",
    "load_catalog",
    "load_machine_file",
]
