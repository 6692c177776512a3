"""What a Parquet dataset's footers say, read without touching its data.

Before an engine reads Parquet that hybridflow did not write, the footers tell whether each file is
Parquet at all, whether all files share one schema, how many rows there are and which columns can
hold nulls. Engines report such problems in their own terms (`Py4JJavaError`, `KeyError`, a snappy
error); this module names the file and what is wrong with it, the same way for every engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from ..errors import DataError, first_line
from . import storage

if TYPE_CHECKING:  # imported where used: validate checks a file's framing without pyarrow
    import pyarrow as pa
    import pyarrow.parquet as pq

MAGIC = b"PAR1"
PIECE_BYTES = 256 * 2**20  # engines read consecutive row groups up to about this much data per task


class Piece(NamedTuple):
    """Consecutive row groups of one file: what one read task of an engine reads."""

    file: PurePath
    row_groups: tuple[int, ...]
    rows: int
    bytes: int  # uncompressed, as the footer says: about what the rows take in memory


@dataclass(frozen=True)
class Footers:
    schema: pa.Schema  # the files' common schema, physical variants (large_string, ...) normalised
    rows: int
    nullable: frozenset[str]  # top-level columns that hold nulls, or whose footers do not say
    pieces: tuple[Piece, ...]  # of about PIECE_BYTES each, in file order
    variants: bool = False  # some file stores a physical variant (string_view, large_list, ...)
    # the newest value of each column asked for whose statistics tell it in every file (None: all null)
    newest: dict[str, Any] = field(default_factory=dict)


def read_footers(dataset: str, files: Sequence[PurePath], filesystem=None, newest: Sequence[str] = ()) -> Footers:
    """Footers of every file (local, or ObjectPaths reached through `filesystem`), checked: raises
    DataError naming the first bad file. `newest`: timestamp or date columns whose newest value to
    take from the statistics (left out of Footers.newest where some row group has none)."""
    if not files:
        raise DataError(f"dataset '{dataset}' has no Parquet files")
    from .contract import standard_schema

    reference: tuple[PurePath, pa.Schema] | None = None
    rows = 0
    nullable: set[str] = set()
    pieces: list[Piece] = []
    variants = False
    maxima: dict[str, list] = {column: [] for column in newest}
    for file in files:
        metadata = _metadata(dataset, file, filesystem)
        stored = metadata.schema.to_arrow_schema()
        schema = standard_schema(stored)
        variants = variants or schema.types != stored.types
        if reference is None:
            reference = (file, schema)
        else:
            _check_same_schema(dataset, reference, file, schema)
        rows += metadata.num_rows
        nullable |= _nullable_columns(metadata)
        pieces += _pieces(file, metadata)
        for column, values in maxima.items():
            if values is not None:
                maxima[column] = newest_in(metadata, stored, column, values)
    known = {column: max(values, default=None) for column, values in maxima.items() if values is not None}
    return Footers(reference[1].remove_metadata(), rows, frozenset(nullable), tuple(pieces), variants, known)


def _metadata(dataset: str, file: PurePath, filesystem) -> pq.FileMetaData:
    import pyarrow as pa
    import pyarrow.parquet as pq

    problem = framing_problem(file, filesystem)
    if problem:
        raise DataError(f"input '{dataset}': {file} {problem}",
                        hint="replace the file with a complete Parquet file, or remove it from the input")
    try:
        return pq.read_metadata(str(file), filesystem=filesystem)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"input '{dataset}': {file} has a corrupt Parquet footer ({first_line(exc)})",
                        hint="replace the file with a complete Parquet file, or remove it from the input") from None


def framing_problem(file: PurePath, filesystem=None) -> str | None:
    """Parquet files start and end with PAR1, and the footer's length sits just before the end."""
    try:
        size = storage.size_of(file, filesystem)
        with storage.open_input(file, filesystem) as handle:
            head = handle.read(4)
            handle.seek(max(size - 8, 0))
            tail = handle.read(8)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if size == 0:
        return "is empty, not a Parquet file"
    if head != MAGIC:
        return "is not a Parquet file (it does not start with PAR1)"
    if size < 12 or tail[4:] != MAGIC:
        return "is truncated (it ends before its Parquet footer)"
    if int.from_bytes(tail[:4], "little") > size - 12:
        return "is truncated (its footer claims more bytes than the file has)"
    return None


def _check_same_schema(dataset: str, reference: tuple[PurePath, pa.Schema], file: PurePath, schema: pa.Schema) -> None:
    first, expected = reference
    theirs = {f.name: f.type for f in expected}
    ours = {f.name: f.type for f in schema}
    for name in [*theirs, *[n for n in ours if n not in theirs]]:
        if name not in ours:
            what = f"has no column '{name}' ({theirs[name]} in {first.name})"
        elif name not in theirs:
            what = f"has a column '{name}' ({ours[name]}) that {first.name} lacks"
        elif ours[name] != theirs[name]:
            what = f"has column '{name}' as {ours[name]} where {first.name} has {theirs[name]}"
        else:
            continue
        raise DataError(f"input '{dataset}': the files' schemas differ: {file} {what}",
                        hint="rewrite the files with one schema, or declare a schema and read them separately")


def _nullable_columns(metadata: pq.FileMetaData) -> set[str]:
    """Top-level columns whose footer statistics count nulls (or do not say): leaves of nested
    columns are left out, those columns reach pandas as Arrow types whatever their nulls."""
    schema = metadata.schema
    flat = [i for i in range(len(schema)) if len(schema.column(i).path.split(".")) == 1]
    found = set()
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for i in flat:
            stats = row_group.column(i).statistics
            if stats is None or not stats.has_null_count or stats.null_count:
                found.add(schema.column(i).path)
    return found


def _pieces(file: PurePath, metadata: pq.FileMetaData) -> list[Piece]:
    pieces, current, rows, size = [], [], 0, 0
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        if current and size + row_group.total_byte_size > PIECE_BYTES:
            pieces.append(Piece(file, tuple(current), rows, size))
            current, rows, size = [], 0, 0
        current.append(group)
        rows += row_group.num_rows
        size += row_group.total_byte_size
    pieces.append(Piece(file, tuple(current), rows, size))  # a file of no row groups is still one (empty) piece
    return pieces


class ColumnStatistics(NamedTuple):
    """One column chunk's statistics: its NULLs (None where the footer does not count them), and the
    lowest and highest of its other values where the column holds integers and the footer has them."""

    nulls: int | None
    low: int | None = None
    high: int | None = None


def row_group_statistics(metadata: pq.FileMetaData,
                         columns: Sequence[str]) -> list[tuple[int, dict[str, ColumnStatistics]]]:
    """Each row group's row count and the statistics of those of `columns` that are top-level columns
    of the file (a nested leaf or a column the file lacks is left out)."""
    import pyarrow as pa

    stored = metadata.schema.to_arrow_schema()
    leaves = {c: leaf for c in columns if c in stored.names and (leaf := top_level_leaf(metadata, c)) is not None}
    integers = {c for c in leaves if pa.types.is_integer(stored.field(c).type)}
    groups = []
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        found = {}
        for column, leaf in leaves.items():
            stats = row_group.column(leaf).statistics
            nulls = stats.null_count if stats is not None and stats.has_null_count else None
            ranged = column in integers and stats is not None and stats.has_min_max
            found[column] = ColumnStatistics(nulls, stats.min, stats.max) if ranged else ColumnStatistics(nulls)
        groups.append((row_group.num_rows, found))
    return groups


def newest_in(metadata: pq.FileMetaData, stored: pa.Schema, column: str, values: list) -> list | None:
    """`values` and the newest `column` of one file, from its row groups' max statistics, as the
    column's own Arrow type gives it (its unit and time zone); None where the statistics cannot tell."""
    import pyarrow as pa

    leaf = top_level_leaf(metadata, column) if column in stored.names else None  # not a nested leaf's path
    physical = None if leaf is None else _physical_type(metadata.schema.column(leaf).logical_type.to_json())
    if physical is None or not (pa.types.is_timestamp(stored.field(column).type)
                                or pa.types.is_date(stored.field(column).type)):
        return None  # an INT96 or plain integer column: its statistics say nothing of time
    newest = None
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        stats = row_group.column(leaf).statistics
        if row_group.num_rows == 0 or (stats is not None and stats.has_null_count
                                       and stats.null_count == row_group.num_rows):
            continue  # no value in it to be the newest
        if stats is None or not stats.has_min_max:
            return None
        newest = stats.max_raw if newest is None else max(newest, stats.max_raw)
    if newest is None:
        return values
    return [*values, pa.scalar(newest, physical).cast(stored.field(column).type).as_py()]


def _physical_type(logical_json: str) -> pa.DataType | None:
    """The Arrow type of a timestamp or date column's stored integers (Parquet's unit, UTC or not)."""
    import json

    import pyarrow as pa

    logical = json.loads(logical_json)
    if logical.get("Type") == "Date":
        return pa.date32()
    if logical.get("Type") != "Timestamp":
        return None
    unit = {"milliseconds": "ms", "microseconds": "us", "nanoseconds": "ns"}[logical["timeUnit"]]
    return pa.timestamp(unit, tz="UTC" if logical["isAdjustedToUTC"] else None)


def each_row_group(files: Sequence[PurePath], footers: Sequence[pq.FileMetaData], read, **options):
    """`read(reader, index)` of every row group of local Parquet `files` (their `footers`), a few side
    by side, in order: a generator; closing it early cancels what has not started. Each row group gets
    a reader of its own (`options`: ParquetFile's): one ParquetFile is not safe across threads."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    def task(group: tuple) -> Any:
        path, metadata, index = group
        with pq.ParquetFile(path, metadata=metadata, **options) as reader:
            return read(reader, index)

    groups = [(str(f), metadata, i) for f, metadata in zip(files, footers) for i in range(metadata.num_row_groups)]
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        try:
            yield from pool.map(task, groups)
        finally:
            pool.shutdown(cancel_futures=True)


def top_level_leaf(metadata: pq.FileMetaData, column: str) -> int | None:
    schema = metadata.schema
    return next((i for i in range(len(schema)) if schema.column(i).path == column), None)
