"""Arrow-level reading and writing of the Parquet that passes between stages.

Everything written here follows one on-disk contract that every engine can read
back losslessly: timestamps in microseconds (nanoseconds are refused by Spark),
no pandas index or pandas metadata, a few large files rather than many small ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .contract import check_schema
from .errors import DataError

ROWS_PER_FILE = 4_000_000
ROW_GROUP_ROWS = 1_000_000


@dataclass(frozen=True)
class TableSource:
    """Where a stage input comes from: a published version's files, or an external path."""

    name: str
    files: tuple[Path, ...]  # for external inputs: the path given (a file or a directory)
    format: str = "parquet"
    schema: pa.Schema | None = None  # the declared or recorded schema, applied on read


def read_arrow(source: TableSource) -> pa.Table:
    """A dataset as one Arrow table; a declared schema is applied and then checked."""
    try:
        if source.format in ("csv", "json"):
            table = _read_text(source, source.format)
        else:
            files = [str(f) for f in source.files]
            table = pq.read_table(files if len(files) > 1 else files[0])
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot read dataset '{source.name}': {exc}") from exc
    if source.schema is not None:
        check_schema(source.name, dict(zip(source.schema.names, source.schema.types)), table.schema)
        table = table.select(source.schema.names).cast(source.schema)  # exact declared types and order
    return table


def _read_text(source: TableSource, fmt: str) -> pa.Table:
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson

    files = _expand(source.files[0], ("." + fmt, ".jsonl", ".ndjson") if fmt == "json" else (".csv",))
    if fmt == "csv":
        types = dict(zip(source.schema.names, source.schema.types)) if source.schema else None
        tables = [pacsv.read_csv(f, convert_options=pacsv.ConvertOptions(column_types=types)) for f in files]
    else:
        tables = [pajson.read_json(f, parse_options=pajson.ParseOptions(explicit_schema=source.schema))
                  for f in files]
    return pa.concat_tables(tables, promote_options="default")


def _expand(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
    if not files:
        raise DataError(f"no {'/'.join(suffixes)} files under {path}")
    return files


def write_arrow(table: pa.Table, directory: Path) -> pa.Schema:
    """Write a table as part-NNNNN.parquet files; refuses to lose timestamp precision."""
    table = table.replace_schema_metadata(None)
    chunks = range(0, max(table.num_rows, 1), ROWS_PER_FILE)
    for i, offset in enumerate(chunks):
        pq.write_table(table.slice(offset, ROWS_PER_FILE), directory / f"part-{i:05d}.parquet",
                       row_group_size=ROW_GROUP_ROWS, coerce_timestamps="us",
                       allow_truncated_timestamps=False, compression="snappy")
    return table.schema
