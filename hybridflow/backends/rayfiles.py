"""Parquet that hybridflow reads into Ray, as a Ray Data datasource of its own.

Ray's `read_parquet` took 2-3x what pyarrow needs for the same files on this machine
(scripts/bench_handoff.py: 3.3 s against 1.1 s for 5M rows), spent in its scan's batching and
metadata tasks. Here each read task is one piece from the footers (consecutive row groups of one
file, about PIECE_BYTES), read by pyarrow in a Ray worker and handed over a row group at a time
(split further only to give every CPU two blocks), so the read stays lazy and streaming. The
footers already say every piece's rows and size, so Ray plans without opening a file, and the
blocks come out in the declared order and exact types, with partition columns restored from the
paths. Ray's projection pushdown (a stage's `select_columns`) reaches the files: only the columns
used are read.
"""

from __future__ import annotations

import functools

import pyarrow as pa
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from ..data.footers import Footers, Piece
from ..data.tables import TableSource, read_piece


class ParquetPieces(Datasource):
    def __init__(self, source: TableSource, footers: Footers) -> None:
        super().__init__()
        self._projection_map = None  # all columns, until Ray pushes a projection down
        self.source = source
        self.schema = source.schema or footers.schema
        self.pieces = footers.pieces

    def get_name(self) -> str:
        return f"hybridflow({self.source.name})"

    def supports_projection_pushdown(self) -> bool:
        return True

    def estimate_inmemory_data_size(self) -> int:
        return sum(piece.bytes for piece in self.pieces)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context=None) -> list[ReadTask]:
        columns = self._get_data_columns()
        names = self.schema.names if columns is None else [n for n in self.schema.names if n in columns]
        schema = pa.schema([self.schema.field(name) for name in names])
        share = len(names) / max(len(self.schema.names), 1)  # of a piece's bytes, the columns read
        return [ReadTask(functools.partial(_read, piece, self.source, schema),
                         BlockMetadata(num_rows=piece.rows, size_bytes=int(piece.bytes * share),
                                       exec_stats=None, input_files=[str(piece.file)]),
                         schema=schema, per_task_row_limit=per_task_row_limit)
                for piece in self.pieces]


def _read(piece: Piece, source: TableSource, schema: pa.Schema):
    """Runs in a Ray worker: the piece's row groups, one block each (at least one block per task)."""
    groups = piece.row_groups or ()
    if not groups:
        yield schema.empty_table()
    for group in groups:
        yield read_piece(piece._replace(row_groups=(group,)), source, schema)
