"""`runstate export`: the transitions and rejections topics as Parquet files, incrementally."""

import json
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from processor.analytics.reader import ReadError
from processor.cli.options import KafkaContext, option, pass_kafka


@click.command()
@option(
    "--out",
    env="OUT",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of the Parquet files (created if missing). Each export adds "
    "transitions-NNNNN.parquet and rejections-NNNNN.parquet, NNNNN one more than the "
    "folder's highest; nothing when there is nothing new.",
)
@option(
    "--offsets-file",
    env="OFFSETS_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where the export keeps the next offset of every partition: an export starts "
    "where the previous one stopped. Default: offsets.json in --out.",
)
@option(
    "--rejections/--no-rejections",
    env="REJECTIONS",
    default=True,
    help="Export the rejections topic too.",
)
@pass_kafka
def export(out: Path, offsets_file: Path | None, rejections: bool, kafka: KafkaContext) -> None:
    """Write the transitions (and rejections) committed since the last export to Parquet.

    Reads read_committed up to the end of each partition as it is when the export
    starts, from the positions in the offsets file; writes the files, then the new
    positions. Flat typed columns (docs/analytics.md); payload and metadata as JSON
    strings. Progress on stderr, a JSON summary on stdout.
    """
    # Imported here: pyarrow is the analytics extra's, not every install's.
    try:
        from processor.analytics.export import export as export_new
    except ImportError as exc:
        raise click.ClickException(
            f"{exc}: runstate export needs the analytics extra: pip install 'runstate[analytics]'"
        ) from exc
    settings = kafka.settings  # Kafka answers, before any progress is shown
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("Exporting: 0 records; offsets read", total=None)

        def shown(records: int, read: int, total: int) -> None:
            described = f"Exporting: {records:,} records; offsets read"
            progress.update(task, description=described, completed=read, total=total)

        try:
            exported = export_new(settings, kafka.topics, out, offsets_file, rejections, shown)
        except (ValueError, ReadError) as exc:
            raise click.ClickException(str(exc)) from exc
    for g in exported.gaps:
        console.print(
            f"[yellow]warning[/] {exported.topics[g.kind]}[{g.partition}]: offsets "
            f"{g.stored}..{g.low - 1} were deleted by retention before this export read them"
        )
    click.echo(json.dumps(exported.summary()))
