"""Machine files (YAML text) to a linted, compiled machine, with errors that name the line."""

import json
from collections.abc import Iterator
from typing import Any

import yaml
from pydantic import ValidationError

from processor.engine.lint import LintIssue, Path, lint
from processor.engine.machine import Machine, compile_machine
from schemas.machine import MachineSpec


class MachineFileError(ValueError):
    """A machine file that cannot be used; each problem reads `file:line: what`."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def parse_machine(text: str, filename: str = "<machine>") -> Machine:
    """Parse, validate, lint and compile one machine file's text."""
    spec, lines = _parse_spec(text, filename)
    issues = lint(spec)
    if issues:
        raise MachineFileError([_located(filename, lines, i.path, i.message) for i in issues])
    return compile_machine(spec)


def lint_machine_text(text: str, filename: str = "<machine>") -> list[str]:
    """Every problem of a machine file as `file:line: message`; empty when it is sound."""
    try:
        parse_machine(text, filename)
    except MachineFileError as exc:
        return exc.problems
    return []


def _parse_spec(text: str, filename: str) -> tuple[MachineSpec, dict[Path, int]]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise MachineFileError([f"{filename}:{line}: not valid YAML: {exc}"]) from exc
    if not isinstance(data, dict):
        raise MachineFileError([f"{filename}:1: a machine file is a mapping (name:, states:, ...)"])
    lines = dict(_node_lines(root, ()))
    try:
        spec = MachineSpec.model_validate_json(_to_json(data))
    except ValidationError as exc:
        raise MachineFileError(
            [
                _located(filename, lines, tuple(err["loc"]), err["msg"])
                for err in exc.errors(include_url=False)
            ]
        ) from exc
    return spec, lines


def _to_json(data: Any) -> str:
    # Validate as JSON so lists may fill tuple fields under strict mode, exactly as on the wire.
    return json.dumps(data, default=str)


def _node_lines(node: yaml.Node | None, path: Path) -> Iterator[tuple[Path, int]]:
    if node is None:
        return
    yield path, node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield from _node_lines(value, (*path, str(key.value)))
            yield (*path, str(key.value)), key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _node_lines(item, (*path, i))


def _located(filename: str, lines: dict[Path, int], path: Path, message: str) -> str:
    where = ".".join(str(p) for p in path) or "(top)"
    probe = path
    while probe and probe not in lines:
        probe = probe[:-1]
    return f"{filename}:{lines.get(probe, 1)}: {where}: {message}"


__all__ = ["LintIssue", "MachineFileError", "lint_machine_text", "parse_machine"]
