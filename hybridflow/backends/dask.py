"""Dask: stages get dask.dataframe.DataFrames with Arrow-backed dtypes, on a local or attached cluster.

The local cluster binds to 127.0.0.1 with the dashboard off. Data stays on the workers:
the runner never collects a frame into this process.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa

from ..errors import DataError, UnavailableError
from ..tables import TableSource, read_arrow, read_partitioned_file
from .base import Backend, check_reachable, code_archive, index_as_columns, split_host_port


class DaskBackend(Backend):
    name = "dask"
    frame_types = "dask.dataframe.DataFrame"

    def __init__(self, settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.client = None
        self.cluster = None  # only set when we started it

    @property
    def address(self) -> str:
        return self.settings.address or "a local cluster"

    def start(self, code: Sequence[Path] = ()) -> None:
        from distributed import Client, LocalCluster

        try:
            if self.settings.address:
                host, port = split_host_port(self.settings.address, 8786)
                check_reachable("dask", self.settings.address, host, port)
                self.client = Client(self.settings.address, timeout="15s")
            else:
                processes = True if self.settings.processes is None else self.settings.processes
                # worker processes listen on 127.0.0.1 only; threads in this process listen nowhere
                network = {"host": "127.0.0.1"} if processes else {}
                self.cluster = LocalCluster(
                    n_workers=self.settings.n_workers or 2,
                    threads_per_worker=self.settings.threads_per_worker or 1, processes=processes,
                    memory_limit=self.settings.memory_limit or "auto", dashboard_address=None,
                    silence_logs=logging.ERROR, **network)
                self.client = Client(self.cluster)
            for path in code:  # workers import the stage modules to run functions defined there
                self.client.upload_file(str(code_archive(path, self.log_dir)))
        except UnavailableError:
            raise
        except Exception as exc:
            self.stop()
            raise UnavailableError(f"dask failed to start ({self.address}): {exc}") from exc

    def handles(self) -> dict[str, Any]:
        return {"dask": self.client}

    def is_frame(self, value: Any) -> bool:
        import dask.dataframe as dd

        return isinstance(value, dd.DataFrame)

    def read(self, source: TableSource):
        import dask.dataframe as dd
        import pandas as pd

        if source.format != "parquet":  # external text input: read and typed once, then distributed
            return dd.from_pandas(read_arrow(source).to_pandas(types_mapper=pd.ArrowDtype), npartitions=2)
        if source.partition_by:  # one task per file, partition columns restored from its path
            meta = source.schema.empty_table().to_pandas(types_mapper=pd.ArrowDtype)
            return dd.from_map(_read_partitioned_pandas, list(source.files), source=source, meta=meta)
        return dd.read_parquet([str(f) for f in source.files], dtype_backend="pyarrow",
                               calculate_divisions=False, index=False)

    def write_files(self, frame: Any, directory: Path, partition_by: tuple[str, ...]) -> pa.Schema:
        frame = index_as_columns(frame)
        try:
            schema = pa.Schema.from_pandas(frame._meta, preserve_index=False).remove_metadata()
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise DataError(f"cannot derive an Arrow schema from the frame: {exc}") from exc
        frame.to_parquet(str(directory), write_index=False, engine="pyarrow", schema=schema,
                         partition_on=list(partition_by) or None, write_metadata_file=False,
                         coerce_timestamps="us", allow_truncated_timestamps=False)
        return schema

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None


def _read_partitioned_pandas(file: Path, source: TableSource):
    import pandas as pd

    return read_partitioned_file(file, source).select(source.schema.names).to_pandas(types_mapper=pd.ArrowDtype)


def create(settings, log_dir: Path) -> DaskBackend:
    return DaskBackend(settings, log_dir)
