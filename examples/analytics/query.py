"""Run the example queries of queries.sql over a `runstate export` folder with DuckDB.

    pip install 'runstate[analytics]'
    runstate export --out ./export
    python examples/analytics/query.py ./export                    # every query
    python examples/analytics/query.py ./export time_in_state      # some, by name

Prints one JSON object: query name -> its rows, each row an object of its columns.
DuckDB reads the Parquet files in place; nothing is loaded or copied.
"""

import json
import re
import sys
from pathlib import Path
from typing import Any

import duckdb

QUERIES = Path(__file__).with_name("queries.sql")
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(path: Path = QUERIES) -> dict[str, str]:
    """Query name -> its SQL, from the `-- name:` lines of the file."""
    text = path.read_text()
    marks = list(_NAME.finditer(text))
    return {
        m.group(1): text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        .strip()
        .rstrip(";")
        for i, m in enumerate(marks)
    }


def connect(folder: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the views `transitions` and `rejections` over the folder's
    files, one row per record (see queries.sql)."""
    db = duckdb.connect()
    glob = str(folder.resolve()).replace("'", "''")
    db.execute(
        f"""CREATE VIEW transitions AS
        SELECT * FROM read_parquet('{glob}/transitions-*.parquet')
        QUALIFY row_number() OVER (PARTITION BY transition_id, at_ms ORDER BY "offset") = 1"""
    )
    if any(folder.glob("rejections-*.parquet")):  # none after exports with --no-rejections
        db.execute(
            f"""CREATE VIEW rejections AS
            SELECT * FROM read_parquet('{glob}/rejections-*.parquet')
            QUALIFY row_number() OVER (PARTITION BY "partition", "offset") = 1"""
        )
    return db


def run(db: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cursor = db.execute(sql)
    columns = [d[0] for d in cursor.description]
    return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 2
    folder, names = Path(argv[0]), argv[1:]
    queries = load_queries()
    unknown = [n for n in names if n not in queries]
    if unknown:
        print(f"unknown queries {unknown}; there are {sorted(queries)}", file=sys.stderr)
        return 2
    db = connect(folder)
    out = {name: run(db, queries[name]) for name in names or queries}
    print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
