"""External CSV and JSON inputs: their files, their schema from each file's first block, one file
read by pyarrow, and a streaming check that finds the first value no engine could parse.

Engines read text inputs themselves, in their own workers: hybridflow's process only looks at the
first block of each file (the column names, and whether the declared types parse there). When an
engine then fails on a value further down, `find_bad_value` streams the files once more, in batches,
to name the file and the column, the same way whichever engine failed.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import TYPE_CHECKING, Iterator

from ..errors import DataError, first_line
from . import storage
from .contract import check_schema

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa

SUFFIXES = {"csv": (".csv",), "json": (".json", ".jsonl", ".ndjson")}
FIRST_BLOCK = 1 << 20  # what the first-block look at each file reads
BATCH_BLOCK = 16 << 20  # what a streaming read holds at once


def text_files(path: PurePath, fmt: str, filesystem=None) -> list[PurePath]:
    """The data files of an external text input given as a file or a directory (local, or an
    ObjectPath reached through `filesystem`)."""
    if not storage.is_dir(path, filesystem):
        return [path]
    suffixes = SUFFIXES[fmt]
    files = [p for p in storage.files_under(path, filesystem) if p.suffix in suffixes
             and not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts)]
    if not files:
        raise DataError(f"no {'/'.join(suffixes)} files under {path}",
                        hint="point the dataset's path at the folder that holds them, or fix its format")
    return files


def _opened(file: PurePath, filesystem):
    """What pyarrow's text readers read from: a local path, or the object's stream."""
    if filesystem is None:
        return file
    return filesystem.open_input_stream(str(file))


def _stream(file: PurePath, fmt: str, schema: pa.Schema | None, block_size: int, filesystem=None):
    """pyarrow's streaming reader of one file; the declared schema types the columns it names."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson

    file = _opened(file, filesystem)
    if fmt == "csv":
        types = dict(zip(schema.names, schema.types)) if schema is not None else None
        return pacsv.open_csv(file, read_options=pacsv.ReadOptions(block_size=block_size),
                              convert_options=pacsv.ConvertOptions(column_types=types))
    return pajson.open_json(file, read_options=pajson.ReadOptions(block_size=block_size),
                            parse_options=pajson.ParseOptions(explicit_schema=schema))


def read_text_file(file: PurePath, fmt: str, schema: pa.Schema | None, only_declared: bool = True,
                   filesystem=None) -> pa.Table:
    """One whole file, typed as declared; `only_declared`: just the declared columns, in their
    order and exact types (what engines' workers call)."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson

    if fmt == "csv":
        types = dict(zip(schema.names, schema.types)) if schema is not None else None
        table = pacsv.read_csv(_opened(file, filesystem), convert_options=pacsv.ConvertOptions(column_types=types))
    else:
        table = pajson.read_json(_opened(file, filesystem), parse_options=pajson.ParseOptions(explicit_schema=schema))
    if schema is None or not only_declared:
        return table
    return table.select(schema.names).cast(schema)


def file_schema(dataset: str, file: PurePath, fmt: str, schema: pa.Schema | None, filesystem=None) -> pa.Schema:
    """A file's columns as its first block says (declared types where declared), checked against
    the declared schema by name: a missing or extra column fails here, before any engine reads."""
    import pyarrow as pa

    try:
        reader = _stream(file, fmt, schema, FIRST_BLOCK, filesystem)
        found = reader.schema
        reader.close()
    except (OSError, pa.ArrowException) as exc:
        raise unreadable(dataset, file, exc) from None
    if schema is not None:
        check_schema(dataset, dict(zip(schema.names, schema.types)), found)
    return found


def input_schema(dataset: str, files: list[PurePath], fmt: str, schema: pa.Schema | None,
                 filesystem=None) -> pa.Schema:
    """The schema engines read the input with: the declared one after checking every file's first
    block, or (undeclared) the types pyarrow infers from the first block of each file, unified."""
    import pyarrow as pa

    found = [file_schema(dataset, f, fmt, schema, filesystem) for f in files]
    if schema is not None:
        return schema
    try:
        return pa.unify_schemas(found, promote_options="permissive")
    except pa.ArrowException as exc:
        raise DataError(f"input '{dataset}': its files' columns have types that do not unify: {first_line(exc)}",
                        hint="declare the dataset's schema in the pipeline file") from None


def csv_header(file: PurePath, filesystem=None) -> list[str]:
    """A CSV file's column names, in the file's order (Spark maps a schema onto them by position)."""
    import pyarrow.csv as pacsv

    reader = pacsv.open_csv(_opened(file, filesystem), read_options=pacsv.ReadOptions(block_size=FIRST_BLOCK),
                            convert_options=pacsv.ConvertOptions(column_types={}))
    names = reader.schema.names
    reader.close()
    return names


def find_bad_value(dataset: str, files: list[PurePath], fmt: str, schema: pa.Schema | None,
                   filesystem=None) -> DataError | None:
    """Stream every file with the schema the engines used; the first failure, naming its file."""
    import pyarrow as pa

    for file in files:
        try:
            for _ in _batches(file, fmt, schema, filesystem):
                pass
        except (OSError, pa.ArrowException) as exc:
            return unreadable(dataset, file, exc)
    return None


def _batches(file: PurePath, fmt: str, schema: pa.Schema | None, filesystem=None) -> Iterator[pa.RecordBatch]:
    reader = _stream(file, fmt, schema, BATCH_BLOCK, filesystem)
    try:
        yield from reader
    finally:
        reader.close()


def unreadable(dataset: str, file: PurePath, exc: BaseException) -> DataError:
    return DataError(f"input '{dataset}' cannot be read: {file}: {first_line(exc)}",
                     hint="fix the value in the file, or the column's type in the dataset's schema")
