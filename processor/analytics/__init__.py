"""The topics for analytics: a reader from stored offsets, flat typed columns, and the
Parquet files of `runstate export` (parquet.py needs the analytics extra: pyarrow)."""
