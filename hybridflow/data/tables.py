"""Arrow-level reading and writing of the Parquet that passes between stages.

Everything written here follows one on-disk contract that every engine can read
back losslessly: timestamps in microseconds (nanoseconds are refused by Spark),
no pandas index or pandas metadata, a few large files rather than many small ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING
from urllib.parse import unquote

from ..errors import DataError, first_line
from ..settings import TARGET_FILE_SIZE
from . import storage
from .contract import check_schema, standard_schema
from .footers import Piece
from .storage import uri_of
from .stores import Settings

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
ROW_GROUP_ROWS = 1_000_000
SAMPLE_ROWS = 65_536  # rows written to memory to learn what a row costs in Parquet


@dataclass(frozen=True)
class TableSource:
    """Where a stage input comes from: a published version's files, or an external path."""

    name: str
    files: tuple[PurePath, ...]  # for external inputs: the path given (a file or a directory)
    format: str = "parquet"
    schema: pa.Schema | None = None  # the declared or recorded schema, applied on read
    partition_by: tuple[str, ...] = ()  # Hive-style partition columns, their values in the file paths
    base: PurePath | None = None  # the directory the partition paths start from
    store: Settings | None = None  # how to reach files in object storage (storage.ObjectPath); None: local

    @property
    def filesystem(self):
        """pyarrow's filesystem for the files (None: local), made once per process: a source is
        shipped to engines' workers, which make their own."""
        return self.store.arrow_filesystem() if self.store is not None else None

    def uris(self) -> list[str]:
        """The files as engines that take URIs name them (s3://bucket/key, or the local path)."""
        return [uri_of(f) for f in self.files]


def read_arrow(source: TableSource) -> pa.Table:
    """A dataset as one Arrow table; a declared schema is applied and then checked."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if source.format in ("csv", "json"):
            table = _read_text(source, source.format)
        elif source.partition_by:
            table = pa.concat_tables([read_partitioned_file(f, source) for f in parquet_files(source)])
        else:
            files = [str(f) for f in source.files]
            # no partitioning inferred from the path: a folder like env=prod above the data is not a column
            table = pq.read_table(files if len(files) > 1 else files[0], partitioning=None,
                                  filesystem=source.filesystem)
    except (OSError, pa.ArrowException) as exc:
        raise _unreadable(source, exc) from exc
    table = standard_types(table)
    if source.schema is not None:
        check_schema(source.name, dict(zip(source.schema.names, source.schema.types)), table.schema)
        table = table.select(source.schema.names).cast(source.schema)  # exact declared types and order
    return table


CORRUPT_HINT = "replace the corrupt file with a good copy, or remove it from the input"


def unreadable_file(dataset: str, file: Path, exc: BaseException) -> DataError:
    """A Parquet file of an input whose data does not decode (its footer did: a damaged page)."""
    return DataError(f"input '{dataset}' cannot be read ({file}): {first_line(exc)}", hint=CORRUPT_HINT)


def damaged_file(source: TableSource) -> tuple[Path, Exception] | None:
    """The first Parquet file of `source` whose data does not decode, and pyarrow's error for it:
    engines rarely say which file a bad page is in. Reads every file again, streaming: only once a
    read failed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for file in parquet_files(source):
        try:
            for _ in pq.ParquetFile(str(file), filesystem=source.filesystem).iter_batches():
                pass
        except (OSError, pa.ArrowException) as exc:
            return file, exc
    return None


def _unreadable(source: TableSource, exc: BaseException) -> DataError:
    """pyarrow's error for a read of several files does not say which one is damaged."""
    found = damaged_file(source) if source.format == "parquet" else None
    if found is not None:
        return unreadable_file(source.name, *found)
    return DataError(f"input '{source.name}' cannot be read: {first_line(exc)}", hint=CORRUPT_HINT)


def standard_types(table: pa.Table) -> pa.Table:
    """The table with physical variants of types (string_view, large_string, dictionary, ...) as
    their standard type: the same values, in the form every engine reads and writes."""
    schema = standard_schema(table.schema)
    return table if schema.equals(table.schema) else table.cast(schema)


def _read_text(source: TableSource, fmt: str) -> pa.Table:
    import pyarrow as pa

    from .textfiles import read_text_file, text_files, unreadable

    tables = []
    for file in [f for path in source.files for f in text_files(path, fmt, source.filesystem)]:
        try:  # every column the file has, typed where declared: the check below names extra ones
            tables.append(read_text_file(file, fmt, source.schema, only_declared=False, filesystem=source.filesystem))
        except (OSError, pa.ArrowException) as exc:
            raise unreadable(source.name, file, exc) from None
    return pa.concat_tables(tables, promote_options="default")


def parquet_files(source: TableSource) -> list[PurePath]:
    """An external dataset is given as its directory (or a file), a published one as its file list;
    a directory's data files as storage.data_files finds them."""
    if len(source.files) == 1 and storage.is_dir(source.files[0], source.filesystem):
        return storage.data_files(source.files[0], source.filesystem)
    return list(source.files)


def partition_values(file: Path, base: Path, partition_by: tuple[str, ...]) -> dict[str, str | None]:
    """{column: raw value} from a Hive-style path such as base/week=2026-11-16/part-0.parquet."""
    found = {}
    for part in file.relative_to(base).parts[:-1]:
        key, sep, value = part.partition("=")
        if sep and key in partition_by:
            found[key] = None if value == HIVE_NULL else unquote(value)
    return found


# What Spark (and Hive) escape as %XX in a partition directory's name: separators, '=' and '%'
# themselves, control characters. Anything else, unicode included, is written as it is: Spark reads
# each %XX back as one character, so a percent-encoded UTF-8 byte sequence would come back garbled.
HIVE_SPECIAL = frozenset('"#%\'*/:=?\\{[]^\x7f') | {chr(code) for code in range(0x20)}


def hive_escape(value: str) -> str:
    """A partition value as every engine names and reads its directory: Spark's own spelling."""
    return "".join(f"%{ord(c):02X}" if c in HIVE_SPECIAL else c for c in value)


def respell_partition_directories(directory: PurePath, partition_by: tuple[str, ...], filesystem=None) -> None:
    """Rename the directories of a pyarrow-written partitioned output (pyarrow, and Ray through it,
    percent-encode every byte of a value outside [A-Za-z0-9._~-]) to hive_escape's spelling. In object
    storage, where a directory is only a prefix of its files' keys, the files that need it are moved."""
    if isinstance(directory, storage.ObjectPath):
        for file in storage.files_under(directory, filesystem):
            parts = file.relative_to(directory).parts
            spelled = [_respelled(part, partition_by[level]) if level < len(partition_by) else part
                       for level, part in enumerate(parts[:-1])]
            if spelled != list(parts[:-1]):
                storage.move_file(file, directory.joinpath(*spelled, parts[-1]), filesystem)
        return
    for level in range(len(partition_by)):
        for path in sorted(directory.glob("/".join(["*"] * (level + 1)))):
            spelled = _respelled(path.name, partition_by[level])
            if path.is_dir() and spelled != path.name:
                path.rename(path.with_name(spelled))


def _respelled(name: str, column: str) -> str:
    key, sep, value = name.partition("=")
    return f"{key}={hive_escape(unquote(value))}" if sep and key == column else name


def read_partitioned_file(file: Path, source: TableSource) -> pa.Table:
    """One file of a partitioned dataset, with its partition columns restored in their recorded types."""
    import pyarrow.parquet as pq

    return _with_partition_columns(pq.read_table(str(file), filesystem=source.filesystem), file, source,
                                   source.partition_by)


def read_piece(piece: Piece, source: TableSource, schema: pa.Schema, columns=None) -> pa.Table:
    """Some row groups of one file, as `schema` says (its order and exact types), partition columns
    restored from the file's path; only `columns` of them, in that order, when given."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = list(columns) if columns is not None else schema.names
    partitions = [name for name in names if name in source.partition_by]
    stored = [name for name in names if name not in source.partition_by]
    try:
        table = pq.ParquetFile(str(piece.file), filesystem=source.filesystem).read_row_groups(
            list(piece.row_groups), columns=stored)
    except (OSError, pa.ArrowException) as exc:
        # this runs in Dask's and Ray's workers, where pyarrow's error does not name the file: the
        # DataError does, and travels back to the driver (pickled) inside the engine's wrappers
        raise unreadable_file(source.name, piece.file, exc) from exc
    table = _with_partition_columns(standard_types(table), piece.file, source, partitions)
    wanted = pa.schema([schema.field(name) for name in names])
    return table.select(names).cast(wanted)


def _with_partition_columns(table: pa.Table, file: Path, source: TableSource, columns) -> pa.Table:
    import pyarrow as pa

    if not columns:
        return table
    values = partition_values(file, source.base or source.files[0], source.partition_by)
    types = dict(zip(source.schema.names, source.schema.types)) if source.schema else {}
    for column in columns:
        raw = pa.array([values.get(column)] * table.num_rows, pa.string())
        table = table.append_column(column, raw.cast(types.get(column, pa.string())))
    return table


def write_arrow(table: pa.Table, directory: Path, partition_by: tuple[str, ...] = (),
                target_file_size: int = TARGET_FILE_SIZE) -> pa.Schema:
    """Write a table as part-NNNNN.parquet files of about `target_file_size` bytes (under Hive-style
    directories when partitioned: one file per partition unless it is larger); refuses to lose
    timestamp precision."""
    import pyarrow.parquet as pq

    table = standard_types(table.replace_schema_metadata(None))
    rows = rows_per_file(table, target_file_size)
    group_rows = min(ROW_GROUP_ROWS, rows)
    if partition_by:
        pq.write_to_dataset(table, directory, partition_cols=list(partition_by), basename_template="part-{i}.parquet",
                            max_rows_per_file=rows, row_group_size=group_rows,
                            coerce_timestamps="us", allow_truncated_timestamps=False, compression="snappy")
        respell_partition_directories(directory, partition_by)
        return table.schema
    for i, offset in enumerate(range(0, max(table.num_rows, 1), rows)):
        pq.write_table(table.slice(offset, rows), directory / f"part-{i:05d}.parquet",
                       row_group_size=group_rows, coerce_timestamps="us",
                       allow_truncated_timestamps=False, compression="snappy")
    return table.schema


def parquet_bytes_per_row(sample: pa.Table) -> float:
    """What a row of this kind takes in snappy Parquet, measured by writing the sample to memory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if sample.num_rows == 0:
        return 1.0
    sink = pa.BufferOutputStream()
    pq.write_table(sample, sink, compression="snappy", coerce_timestamps="us", allow_truncated_timestamps=True)
    return max(sink.getvalue().size / sample.num_rows, 1e-3)


def rows_per_file(table: pa.Table, target_file_size: int) -> int:
    """Rows that make a file of about `target_file_size` bytes, from a sample of up to 64k rows
    spread over the table (its start alone may not be typical)."""
    import pyarrow as pa

    if table.num_rows <= SAMPLE_ROWS:
        sample = table
    else:
        step = table.num_rows // SAMPLE_ROWS
        sample = table.take(pa.array(range(0, step * SAMPLE_ROWS, step)))
    return max(1, int(target_file_size / parquet_bytes_per_row(sample)))


def ensure_schema_file(directory: PurePath, schema: pa.Schema, partition_by: tuple[str, ...] = (),
                       filesystem=None) -> None:
    """An empty output must still publish its schema: some engines write no file at all for zero rows.
    `directory`: a local one, or a prefix in object storage (storage.ObjectPath) with its filesystem."""
    import pyarrow as pa

    if not any(f.suffix == ".parquet" for f in storage.files_under(directory, filesystem)):
        data_fields = [f for f in schema if f.name not in partition_by]
        storage.write_parquet(pa.schema(data_fields).empty_table(), directory / "part-00000.parquet", filesystem)


# for engines that scan files themselves (DuckDB, Polars) and join partition values from the paths

FILE_COLUMN = "__hybridflow_file__"  # the data file of each row, joined to its partition values


def with_string_partitions(schema: pa.Schema, partition_by: tuple[str, ...]) -> pa.Schema:
    """Undeclared partition columns are strings, as on every engine."""
    import pyarrow as pa

    stored = [field for field in schema if field.name not in partition_by]
    return pa.schema(stored + [pa.field(name, pa.string()) for name in partition_by])


def partition_table(files: list[Path], source: TableSource, schema: pa.Schema) -> pa.Table:
    """One row per data file: its path (FILE_COLUMN, as the engine's scan names it) and its partition
    values, parsed by the rules every engine shares and cast to their recorded types."""
    import pyarrow as pa

    base = source.base or source.files[0]
    values = [partition_values(file, base, source.partition_by) for file in files]
    columns = {FILE_COLUMN: pa.array([uri_of(f) for f in files], pa.string())}
    for name in source.partition_by:
        raw = pa.array([found.get(name) for found in values], pa.string())
        columns[name] = raw.cast(schema.field(name).type)
    return pa.table(columns)


def text_dataset(source: TableSource):
    """External CSV or JSON as a pyarrow dataset that an engine scans lazily, in batches (columns it
    does not use are not converted): parsed by pyarrow with the declared types and matched to the
    schema by column name, as on every other engine, so the same text gives the same values and a bad
    value the same error (which names the file)."""
    import pyarrow.csv as pacsv
    import pyarrow.dataset as ds
    import pyarrow.json as pajson

    if source.format == "csv":
        types = dict(zip(source.schema.names, source.schema.types))
        file_format = ds.CsvFileFormat(convert_options=pacsv.ConvertOptions(column_types=types))
    else:
        file_format = ds.JsonFileFormat(parse_options=pajson.ParseOptions(explicit_schema=source.schema))
    return ds.dataset([str(f) for f in source.files], format=file_format, schema=source.schema,
                      filesystem=source.filesystem)
