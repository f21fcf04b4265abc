"""`runstate`: every option is a flag and a RUNSTATE_<FLAG> environment variable.

Each command's module is imported when the command is asked for, not when the CLI
starts: `pip install runstate` (what an agent installs) has no worker in it, so the
worker's modules (rocksdict, Faust, prometheus-client) must not load for `runstate
propose`. A command that needs an extra this install lacks answers, whatever its
arguments, with the pip command that adds the extra (exit 2) instead of an ImportError.
"""

import importlib
import logging
import re
import signal
import sys
from importlib import metadata

import click

from processor.kafka.config import KAFKA_LOG

# name -> (module, attribute, the extra it needs beyond the base install, or None).
# A new command is one line here; `runstate --help` lists them in alphabetical order.
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "broker": ("processor.cli.broker", "broker", None),
    "create": ("processor.cli.runs", "create", None),
    # The demo starts worker processes (and a broker container through testcontainers).
    "demo": ("processor.cli.demo", "demo", "worker"),
    # Parquet files of the transitions and rejections (pyarrow: the analytics extra).
    "export": ("processor.cli.export", "export", "analytics"),
    "get": ("processor.cli.runs", "get", None),
    "history": ("processor.cli.runs", "history", None),
    "keys": ("processor.cli.keys", "keys", None),
    "machines": ("processor.cli.machines", "machines", None),
    "propose": ("processor.cli.runs", "propose", None),
    # Rebuilds the partition stores: rocksdict.
    "replay": ("processor.cli.recovery", "replay", "worker"),
    "stats": ("processor.cli.runs", "stats", None),
    "tail": ("processor.cli.runs", "tail", None),
    "topics": ("processor.cli.topics", "topics", None),
    "verify": ("processor.cli.recovery", "verify", None),
    "worker": ("processor.cli.worker", "worker", "worker"),
}

_NAME = re.compile(r"[A-Za-z0-9._-]+")


def missing_from_extra(extra: str) -> list[str]:
    """The distributions `runstate[extra]` requires that are not installed, from the
    installed package's own metadata (pyproject.toml is the one list). Empty when
    runstate is not installed at all (a source tree on sys.path): the import decides."""
    try:
        requirements = metadata.requires("runstate") or []
    except metadata.PackageNotFoundError:
        return []
    marker = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    missing = []
    for requirement in requirements:
        spec, _, markers = requirement.partition(";")
        name = _NAME.match(spec.strip())
        if name is None or not marker.search(markers):
            continue
        try:
            metadata.distribution(name.group(0))
        except metadata.PackageNotFoundError:
            missing.append(name.group(0))
    return missing


def needs_extra(name: str, extra: str, missing: list[str]) -> click.Command:
    """A stand-in for command `name`: says which extra to install and exits 2; asked for
    --help, says the same as its help and exits 0 (the real help is not here to show)."""
    lacking = f" ({', '.join(missing)} not installed)" if missing else ""
    message = (
        f"`runstate {name}` needs the {extra} extra, which this install leaves out{lacking}; "
        f"install it with: pip install 'runstate[{extra}]'"
    )

    @click.command(
        name,
        help=message,
        short_help=f"Needs pip install 'runstate[{extra}]'.",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    @click.pass_context
    def stand_in(ctx: click.Context) -> None:
        if {"-h", "--help"} & set(ctx.args):
            click.echo(message)
            ctx.exit(0)
        click.echo(f"Error: {message}", err=True)
        ctx.exit(2)

    return stand_in


class LazyGroup(click.Group):
    """A group whose commands are the entries of COMMANDS, each imported on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module_name, attribute, extra = COMMANDS[cmd_name]
        if extra is not None:
            missing = missing_from_extra(extra)
            if missing:
                return needs_extra(cmd_name, extra, missing)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Not installed as a package (no metadata to ask), or the extra's list is
            # short of a module: still the extra's message, not a traceback.
            ours = (exc.name or "").split(".")[0] in {"processor", "schemas"}
            if extra is None or ours:
                raise
            return needs_extra(cmd_name, extra, [exc.name or ""])
        command: click.Command = getattr(module, attribute)
        return command


@click.group(
    cls=LazyGroup,
    context_settings={
        "help_option_names": ["-h", "--help"],
        "show_default": True,
    },
)
@click.version_option(package_name="runstate")
def cli() -> None:
    """runstate: a Kafka-backed state processor for the lifecycle of AI-agent runs.

    Agents, tools, approvers and timers publish proposals; the worker decides each
    against the run's machine and publishes transitions and rejections exactly once.

    Configuration: every option has a flag and an environment variable named
    RUNSTATE_<FLAG> (shown in each command's --help, e.g. RUNSTATE_MACHINE_PATH).
    A flag wins over the environment.

    Agents install `pip install runstate`; the worker, the demo and replay need
    `pip install 'runstate[worker]'`.
    """
    # A command says in one line what went wrong with Kafka (processor/kafka/reach.py);
    # librdkafka's own lines are the worker's to log (--log-level), not a command's.
    KAFKA_LOG.setLevel(logging.CRITICAL)


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        # Importing the worker takes seconds on a busy machine; SIGTERM meanwhile ends it
        # as asked, exit 0, not by the signal (the worker command then installs its own).
        signal.signal(signal.SIGTERM, _stopped_while_starting)
    cli()


def _stopped_while_starting(signum: int, frame: object) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    main()
