"""`runstate`: every option is a flag and a RUNSTATE_<FLAG> environment variable."""

import click

from processor.cli.broker import broker
from processor.cli.demo import demo
from processor.cli.export import export
from processor.cli.keys import keys
from processor.cli.machines import machines
from processor.cli.recovery import replay, verify
from processor.cli.runs import create, get, history, propose, stats, tail
from processor.cli.topics import topics
from processor.cli.worker import worker


@click.group(
    context_settings={
        "help_option_names": ["-h", "--help"],
        "show_default": True,
    }
)
@click.version_option(package_name="runstate")
def cli() -> None:
    """runstate: a Kafka-backed state processor for the lifecycle of AI-agent runs.

    Agents, tools, approvers and timers publish proposals; the worker decides each
    against the run's machine and publishes transitions and rejections exactly once.

    Configuration: every option has a flag and an environment variable named
    RUNSTATE_<FLAG> (shown in each command's --help, e.g. RUNSTATE_MACHINE_PATH).
    A flag wins over the environment.
    """


for command in (
    demo,
    worker,
    create,
    propose,
    get,
    history,
    stats,
    tail,
    replay,
    verify,
    topics,
    machines,
    broker,
    keys,
    export,
):
    cli.add_command(command)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
