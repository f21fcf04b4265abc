"""An export: the transitions (and rejections) committed since the previous export, as
one more Parquet part per topic, and then the positions it reached (the analytics extra).

Reads read_committed up to the end of each partition as it is when the export starts,
from the positions in the offsets file; writes the files, then the new positions, so a
crash before the end leaves the previous positions and no part half-written.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processor.analytics.columns import rejection_row, transition_row
from processor.analytics.parquet import (
    PartWriter,
    load_offsets,
    next_part,
    part_path,
    save_offsets,
)
from processor.analytics.reader import Gap, TransitionReader
from processor.kafka.config import KafkaSettings
from processor.kafka.topics import TopicNames
from schemas.messages import Transition

#: Told how far the export is: (records exported, offsets read, offsets to read in all).
#: Offsets count transaction markers too, so they measure the way, records the work.
Progress = Callable[[int, int, int], None]


@dataclass
class Exported:
    """What an export wrote and where the next one starts."""

    topics: dict[str, str]  # kind -> topic name
    records: dict[str, int]  # kind -> rows written
    files: dict[str, Path | None]  # kind -> the new part (None: nothing new)
    offsets_file: Path
    positions: dict[str, dict[int, int]]  # kind -> partition -> next offset
    gaps: list[Gap]  # offsets retention deleted before they were exported

    def summary(self) -> dict[str, Any]:
        """The export as JSON (what `runstate export` prints)."""
        summary: dict[str, Any] = {
            kind: {"records": self.records[kind], "file": None if f is None else str(f)}
            for kind, f in self.files.items()
        }
        summary["offsets_file"] = str(self.offsets_file)
        summary["positions"] = {
            self.topics[kind]: {str(p): n for p, n in sorted(parts.items())}
            for kind, parts in self.positions.items()
        }
        summary["lost_to_retention"] = [
            {"topic": self.topics[g.kind], "partition": g.partition, "from": g.stored, "to": g.low}
            for g in self.gaps
        ]
        return summary


def export(
    settings: KafkaSettings,
    topics: TopicNames,
    out: Path,
    offsets_file: Path | None = None,
    rejections: bool = True,
    progress: Progress | None = None,
) -> Exported:
    """Export what is new into `out` (created if missing); offsets in `offsets_file`
    (default: offsets.json in `out`). Raises ValueError for an unreadable offsets file
    and ReadError when the topics cannot be read."""
    out.mkdir(parents=True, exist_ok=True)
    offsets_path = offsets_file or out / "offsets.json"
    names = {"transitions": topics.transitions}
    if rejections:
        names["rejections"] = topics.rejections
    reader = TransitionReader(
        settings, topics, positions_from=load_offsets(offsets_path, names), rejections=rejections
    )
    part = next_part(out)
    writers = {kind: PartWriter(part_path(out, kind, part), kind) for kind in names}
    try:
        with reader:
            total = reader.remaining()
            for n, (partition, offset, record) in enumerate(reader, start=1):
                if isinstance(record, Transition):
                    writers["transitions"].add(transition_row(partition, offset, record))
                else:
                    writers["rejections"].add(rejection_row(partition, offset, record))
                if progress is not None and n % 1000 == 0:
                    progress(n, total - reader.remaining(), total)
            if progress is not None:
                progress(sum(w.rows for w in writers.values()), total, total)
            files = {kind: w.close() for kind, w in writers.items()}
            positions = reader.positions()
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    # The files are in place; only now the positions move past their records.
    save_offsets(offsets_path, positions, names)
    records = {kind: w.rows for kind, w in writers.items()}
    return Exported(names, records, files, offsets_path, positions, list(reader.gaps))
