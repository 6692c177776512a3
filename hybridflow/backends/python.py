"""The in-process backend: stages get pandas DataFrames of the dtypes pandas users expect, Arrow
-backed only where no pandas dtype holds the values exactly (see pandas_frames).

A stage on the GPU gets cuDF DataFrames instead, read and written with cuDF's Parquet; its code
calls .to_pandas() where it wants pandas, and may return cuDF, pandas or Arrow frames.
`backends.python.rmm_pool_size` gives GPU stages an RMM memory pool, freed before the next stage.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.tables import TableSource, read_arrow, standard_types, write_arrow
from ..engines.python import ENGINE
from ..errors import DataError
from . import gpu
from .base import Backend, measured_or_none
from .framerules import index_as_columns

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa




class PythonBackend(Backend):
    name = ENGINE.name
    frame_types = ENGINE.frame_types
    isolated_calls = True  # off the GPU: a CUDA context does not survive a fork

    def __init__(self, settings: Any = None) -> None:
        self.rmm_pool_size = getattr(settings, "rmm_pool_size", None)

    def start(self, code=()) -> None:
        pass  # nothing to start: stages run in this process, which imports their code itself

    def reload_code(self, code) -> bool:
        return True  # the watch session imports the changed modules again in this process

    def begin_stage(self, on_gpu: bool, params, log) -> None:
        super().begin_stage(on_gpu, params, log)
        if on_gpu and self.rmm_pool_size:
            import rmm

            rmm.reinitialize(pool_allocator=True, initial_pool_size=gpu.parse_bytes(self.rmm_pool_size))

    def release_gpu_memory(self) -> None:
        gpu.release_process_memory()  # the earlier stage's frames, and its pool

    def stop(self) -> None:
        if self.gpu is not None:
            self.release_gpu_memory()

    def read(self, source: TableSource):
        if self.stage_on_gpu:
            return read_cudf(source)
        from . import pandas_frames  # pandas: imported when a stage reads, not when a run creates the engine

        return pandas_frames.to_pandas(read_arrow(source))

    def is_frame(self, value: Any) -> bool:
        import pandas as pd
        import pyarrow as pa

        return isinstance(value, (pd.DataFrame, pa.Table)) or is_cudf_frame(value)

    def write_files(self, frame: Any, directory: Path, partition_by: tuple[str, ...],
                    target_file_size: int) -> pa.Schema:
        if is_cudf_frame(frame):
            return write_cudf(frame, directory, partition_by)
        return write_arrow(as_arrow(frame), directory, partition_by, target_file_size)

    def write_measured(self, frame: Any, directory: Path, partition_by: tuple[str, ...],  # noqa: PLR0913 - Backend's
                       target_file_size: int, plan) -> tuple[pa.Schema, dict[str, Any] | None]:
        # the Arrow table written is in memory, as the checks would read it back (in the written schema):
        # measured there (partitioned outputs are read back: their partition values come from the paths)
        if partition_by or is_cudf_frame(frame):
            return super().write_measured(frame, directory, partition_by, target_file_size, plan)
        table = standard_types(as_arrow(frame).replace_schema_metadata(None))
        schema = self.write(table, directory, (), target_file_size)
        return schema, measured_or_none(lambda: plan.combine([plan.arrow_partials(table)]))


def as_arrow(frame: Any) -> pa.Table:
    import pyarrow as pa

    from . import pandas_frames

    return frame if isinstance(frame, pa.Table) else pandas_frames.to_arrow(frame)


def is_cudf_frame(value: Any) -> bool:
    cudf = sys.modules.get("cudf")  # a cuDF frame can only exist once cudf is imported
    return cudf is not None and isinstance(value, cudf.DataFrame)


def read_cudf(source: TableSource):
    """cuDF reads plain Parquet itself; partitioned and text inputs are typed by pyarrow (partition
    values from the paths, a declared schema) and then moved to the GPU."""
    import cudf

    if source.format == "parquet" and not source.partition_by:
        return cudf.read_parquet([str(f) for f in source.files])
    return cudf.DataFrame.from_arrow(read_arrow(source))


def write_cudf(frame, directory: Path, partition_by: tuple[str, ...]) -> pa.Schema:
    frame = index_as_columns(frame)
    duplicated = frame.columns[frame.columns.duplicated()].tolist()
    if duplicated:
        raise DataError(f"the frame has duplicate column names: {', '.join(map(str, duplicated))}")
    if partition_by:
        frame.to_parquet(str(directory), partition_cols=list(partition_by), index=False)
    else:
        frame.to_parquet(str(directory / "part-00000.parquet"), index=False)
    return frame.head(0).to_arrow(preserve_index=False).schema


def create(settings: Any, log_dir: Path) -> PythonBackend:
    return PythonBackend(settings)
