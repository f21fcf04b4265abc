"""Flags derived from a settings model's fields (processor/settings.py): the name, the
RUNSTATE_* variable, the default, the help and the type are the field's, declared once.

`settings_options(Model)` gives a command every field of the model as a flag and passes
it `settings=Model(...)`: the flags given on the command line, and for the rest what
pydantic-settings reads from the environment, else the defaults. A value that does not
validate is a usage error (exit 2) naming the flag and the variable.
`setting_option(Model, name)` gives a command that does not take the whole model one
field as an ordinary click option (click reads the variable).
"""

import functools
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import annotated_types
import click
from click.core import ParameterSource
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from processor.settings import Flag, NotAFlag, Settings, env_name

S = TypeVar("S", bound=Settings)
F = TypeVar("F", bound=Callable[..., Any])


class SettingOption(click.Option):
    """An option whose variable is read by the settings model, not by click (--help
    still names it)."""

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        return None


def is_flag(field: FieldInfo) -> bool:
    return not any(isinstance(meta, NotAFlag) for meta in field.metadata)


def _flag(field: FieldInfo) -> Flag | None:
    return next((meta for meta in field.metadata if isinstance(meta, Flag)), None)


def _bare(annotation: Any) -> tuple[Any, list[Any]]:
    """`X | None` as X, and `Annotated[X, ...]` as X with its metadata."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            annotation = args[0]
    if typing.get_origin(annotation) is typing.Annotated:
        return annotation.__origin__, list(annotation.__metadata__)
    return annotation, []


def _click_type(kind: Any, metadata: list[Any], exists: bool) -> Any:
    if typing.get_origin(kind) is Literal:
        return click.Choice([str(arg) for arg in typing.get_args(kind)], case_sensitive=False)
    if kind is int:
        low = next((cast(int, m.ge) for m in metadata if isinstance(m, annotated_types.Ge)), None)
        high = next((cast(int, m.le) for m in metadata if isinstance(m, annotated_types.Le)), None)
        return click.IntRange(min=low, max=high) if low is not None or high is not None else int
    if kind is Path:
        # pydantic's FilePath: an existing file.
        file_only = any(getattr(m, "path_type", None) == "file" for m in metadata)
        return click.Path(exists=exists or file_only, dir_okay=not file_only, path_type=Path)
    return str


def _option_kwargs(name: str, field: FieldInfo) -> tuple[list[str], dict[str, Any]]:
    flag = _flag(field)
    decls = list(flag.decls) if flag else [f"--{name.replace('_', '-')}"]
    kind, metadata = _bare(field.annotation)
    metadata = [*field.metadata, *metadata]
    exists = bool(flag and flag.exists)
    kwargs: dict[str, Any] = {
        "help": field.description,
        "envvar": env_name(name),
        "show_envvar": True,
    }
    default = field.default if field.default is not PydanticUndefined else None
    if kind is bool:
        kwargs.update(is_flag=True, default=bool(default))
    elif typing.get_origin(kind) is tuple:
        kwargs.update(
            multiple=True,
            type=_click_type(typing.get_args(kind)[0], metadata, exists),
            default=default or (),
        )
    else:
        kwargs.update(type=_click_type(kind, metadata, exists), default=default)
    return [*decls, name], kwargs


def setting_option(
    model: type[Settings], name: str, parameter: str | None = None
) -> Callable[[F], F]:
    """Field `name` of `model` as a plain click option (click reads its variable),
    passed to the command as `parameter` (default: the field's name)."""
    decls, kwargs = _option_kwargs(name, model.model_fields[name])
    if parameter is not None:
        decls[-1] = parameter
    return click.option(*decls, **kwargs)


def settings_options(model: type[S]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Every flag of `model` on the command, which receives `settings: model`."""
    names = [name for name, field in model.model_fields.items() if is_flag(field)]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def resolved(*args: Any, **kwargs: Any) -> Any:
            ctx = click.get_current_context()
            given = {}
            for name in names:
                value = kwargs.pop(name)
                if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
                    given[name] = value
            try:
                settings = model(**given)
            except ValidationError as exc:
                raise click.UsageError(describe(exc, model)) from exc
            return command(*args, settings=settings, **kwargs)

        for name in reversed(names):
            decls, kwargs = _option_kwargs(name, model.model_fields[name])
            resolved = click.option(*decls, cls=SettingOption, **kwargs)(resolved)
        return resolved

    return decorate


def describe(error: ValidationError, model: type[Settings]) -> str:
    """One line per invalid setting, naming its flag and its variable."""
    lines = []
    for problem in error.errors():
        name = str(problem["loc"][0]) if problem["loc"] else ""
        field = model.model_fields.get(name)
        message = str(problem["msg"]).removeprefix("Value error, ")
        if field is None:
            lines.append(message)
            continue
        flag = _flag(field)
        spelled = (flag.decls[0] if flag else f"--{name.replace('_', '-')}").split("/")[0]
        lines.append(f"invalid {spelled} (or {env_name(name)}): {message}")
    return "; ".join(lines)
