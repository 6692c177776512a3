"""What a Parquet dataset's footers say, read without touching its data.

Before an engine reads Parquet that hybridflow did not write, the footers tell whether each file is
Parquet at all, whether all files share one schema, how many rows there are and which columns can
hold nulls. Engines report such problems in their own terms (`Py4JJavaError`, `KeyError`, a snappy
error); this module names the file and what is wrong with it, the same way for every engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, NamedTuple, Sequence

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


def read_footers(dataset: str, files: Sequence[PurePath], filesystem=None) -> Footers:
    """Footers of every file (local, or ObjectPaths reached through `filesystem`), checked: raises
    DataError naming the first bad file."""
    if not files:
        raise DataError(f"dataset '{dataset}' has no Parquet files")
    from .contract import standard_schema

    reference: tuple[PurePath, pa.Schema] | None = None
    rows = 0
    nullable: set[str] = set()
    pieces: list[Piece] = []
    variants = False
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
    return Footers(reference[1].remove_metadata(), rows, frozenset(nullable), tuple(pieces), variants)


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
