"""Parquet files of transitions and rejections, and the offsets file that makes an export
incremental. Needs the analytics extra (pyarrow): pip install 'runstate[analytics]'.

An export writes each file under a temporary name and renames it when complete, then
replaces the offsets file: a reader of the folder never sees half a file, and an export
stopped between the two renames writes its records again next time (queries that must
count each record once keep one row per `transition_id`, or per `partition, offset`).
"""

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from processor.analytics.columns import REJECTION_COLUMNS, TRANSITION_COLUMNS

COLUMNS = {"transitions": TRANSITION_COLUMNS, "rejections": REJECTION_COLUMNS}
_PART = re.compile(r"^(?:transitions|rejections)-(\d+)\.parquet$")
OFFSETS_FORMAT = 1


def arrow_schema(kind: str) -> pa.Schema:
    return pa.schema([(name, getattr(pa, type_)()) for name, type_ in COLUMNS[kind].items()])


def next_part(folder: Path) -> int:
    """One more than the highest part number of the folder's files (1 in a new folder)."""
    numbers = [int(m.group(1)) for p in folder.glob("*.parquet") if (m := _PART.match(p.name))]
    return max(numbers, default=0) + 1


def part_path(folder: Path, kind: str, part: int) -> Path:
    return folder / f"{kind}-{part:05d}.parquet"


class PartWriter:
    """One Parquet file, written in row groups of `batch` rows, opened at the first row
    (an export with nothing new writes no file) and renamed into place by `close()`."""

    def __init__(self, path: Path, kind: str, batch: int = 10_000) -> None:
        self.path = path
        self.kind = kind
        self.batch = batch
        self.rows = 0
        self._schema = arrow_schema(kind)
        self._tmp = path.with_name(f".{path.name}.tmp")
        self._pending: list[dict[str, Any]] = []
        self._writer: pq.ParquetWriter | None = None

    def add(self, row: dict[str, Any]) -> None:
        self._pending.append(row)
        self.rows += 1
        if len(self._pending) >= self.batch:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._tmp, self._schema, compression="zstd")
        self._writer.write_table(pa.Table.from_pylist(self._pending, schema=self._schema))
        self._pending = []

    def close(self) -> Path | None:
        """The file written, or None when there were no rows."""
        self._flush()
        if self._writer is None:
            return None
        self._writer.close()
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._tmp.unlink(missing_ok=True)
            self._writer = None


def load_offsets(path: Path, topics: Mapping[str, str]) -> dict[str, dict[int, int]]:
    """{kind: {partition: next offset}} from an offsets file (empty when it does not
    exist). The file keys positions by topic name: `topics` maps kind -> topic name."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        stored = data["topics"]
        if data.get("format") != OFFSETS_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {OFFSETS_FORMAT}")
        return {
            kind: {int(p): int(n) for p, n in stored.get(topic, {}).items()}
            for kind, topic in topics.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not an offsets file of runstate export: {exc}") from exc


def save_offsets(
    path: Path, positions: Mapping[str, Mapping[int, int]], topics: Mapping[str, str]
) -> None:
    """Replace the offsets file in one rename, keeping the positions of topics this
    export did not read (e.g. rejections, after an export with --no-rejections)."""
    stored: dict[str, dict[str, int]] = {}
    if path.exists():
        stored = json.loads(path.read_text()).get("topics", {})
    for kind, parts in positions.items():
        stored[topics[kind]] = {str(p): n for p, n in sorted(parts.items())}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"format": OFFSETS_FORMAT, "topics": stored}, indent=2) + "\n")
    os.replace(tmp, path)
