"""The in-process backend: stages get pandas DataFrames with Arrow-backed dtypes.

Arrow-backed dtypes (pd.ArrowDtype) keep nullable integers, decimals, lists and
structs exactly as written; numpy-backed pandas would turn them into floats and objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from ..errors import DataError
from ..tables import TableSource, read_arrow, write_arrow
from .base import Backend, index_as_columns


class PythonBackend(Backend):
    name = "python"
    frame_types = "pandas DataFrames or pyarrow Tables"

    def start(self, code=()) -> None:
        pass  # nothing to start: stages run in this process, which imports their code itself

    def read(self, source: TableSource) -> pd.DataFrame:
        return read_arrow(source).to_pandas(types_mapper=pd.ArrowDtype)

    def is_frame(self, value: Any) -> bool:
        return isinstance(value, (pd.DataFrame, pa.Table))

    def write_files(self, frame: Any, directory: Path, partition_by: tuple[str, ...]) -> pa.Schema:
        return write_arrow(to_arrow(frame), directory, partition_by)


def to_arrow(frame: pd.DataFrame | pa.Table) -> pa.Table:
    """A pandas frame as an Arrow table, its index handled by the rule every engine shares."""
    if isinstance(frame, pa.Table):
        return frame
    frame = index_as_columns(frame)
    duplicated = frame.columns[frame.columns.duplicated()].tolist()
    if duplicated:
        raise DataError(f"the frame has duplicate column names: {', '.join(map(str, duplicated))}")
    try:
        return pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise DataError(f"cannot convert the frame to Arrow: {exc}",
                        hint="give every column one consistent type") from exc


def create(settings: Any, log_dir: Path) -> PythonBackend:
    return PythonBackend()
