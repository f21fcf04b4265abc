"""`runstate export`: the transitions and rejections topics as Parquet files, incrementally."""

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from processor.analytics.columns import rejection_row, transition_row
from processor.analytics.reader import ReadError, TransitionReader
from processor.cli.options import KafkaContext, option, pass_kafka
from schemas.messages import Transition


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
        from processor.analytics.parquet import (
            PartWriter,
            load_offsets,
            next_part,
            part_path,
            save_offsets,
        )
    except ImportError as exc:
        raise click.ClickException(
            f"{exc}: runstate export needs the analytics extra: pip install 'runstate[analytics]'"
        ) from exc
    console = Console(stderr=True)
    out.mkdir(parents=True, exist_ok=True)
    offsets_path = offsets_file or out / "offsets.json"
    names = {"transitions": kafka.topics.transitions}
    if rejections:
        names["rejections"] = kafka.topics.rejections
    try:
        start = load_offsets(offsets_path, names)
        reader = TransitionReader(
            kafka.settings, kafka.topics, positions_from=start, rejections=rejections
        )
    except (ValueError, ReadError) as exc:
        raise click.ClickException(str(exc)) from exc
    part = next_part(out)
    writers = {kind: PartWriter(part_path(out, kind, part), kind) for kind in names}
    try:
        with (
            reader,
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as progress,
        ):
            total = reader.remaining()
            task = progress.add_task("Exporting records", total=total)
            for n, (partition, offset, record) in enumerate(reader, start=1):
                if isinstance(record, Transition):
                    writers["transitions"].add(transition_row(partition, offset, record))
                else:
                    writers["rejections"].add(rejection_row(partition, offset, record))
                if n % 1000 == 0:
                    progress.update(task, completed=total - reader.remaining())
            progress.update(task, completed=total)
            files = {kind: w.close() for kind, w in writers.items()}
            positions = reader.positions()
    except ReadError as exc:
        for w in writers.values():
            w.abort()
        raise click.ClickException(str(exc)) from exc
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    # The files are in place; only now the positions move past their records.
    save_offsets(offsets_path, positions, names)
    summary: dict[str, Any] = {
        kind: {"records": writers[kind].rows, "file": None if f is None else str(f)}
        for kind, f in files.items()
    }
    summary["offsets_file"] = str(offsets_path)
    summary["positions"] = {
        names[kind]: {str(p): n for p, n in sorted(parts.items())}
        for kind, parts in positions.items()
    }
    summary["lost_to_retention"] = [
        {"topic": names[g.kind], "partition": g.partition, "from": g.stored, "to": g.low}
        for g in reader.gaps
    ]
    for g in reader.gaps:
        console.print(
            f"[yellow]warning[/] {names[g.kind]}[{g.partition}]: offsets {g.stored}..{g.low - 1} "
            "were deleted by retention before this export read them"
        )
    click.echo(json.dumps(summary))
