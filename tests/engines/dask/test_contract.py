"""The backend contract (hybridflow.testing.BackendContract) on an embedded Dask cluster: every type,
odd names, empty and partitioned outputs handed off with the python engine each way and with itself;
and what a publish costs Dask: each partition computed once, in two task graphs."""

from __future__ import annotations

import pyarrow.parquet as pq

from hybridflow.testing import BackendContract
from tests.support.engines import TEST_SETTINGS


class TestDaskContract(BackendContract):
    engine = "dask"
    settings = TEST_SETTINGS["dask"]

    def test_a_published_frame_is_computed_once_in_two_graphs(self, backend, tmp_path):
        """Sizing the files (the rows counted, a sample measured) and writing them share one
        computation of each partition: one graph keeps the partitions and their counts and samples,
        the write is the other."""
        import dask.dataframe as dd
        import pandas as pd

        marks = tmp_path / "marks"
        marks.mkdir()

        def marked(part, directory):  # nested: shipped to the workers by value
            import uuid
            from pathlib import Path

            (Path(directory) / uuid.uuid4().hex).touch()
            return part

        frame = dd.from_pandas(pd.DataFrame({"n": range(10_000)}), npartitions=4)
        frame = frame.map_partitions(marked, str(marks), meta=frame._meta)
        frame = frame[frame["n"] % 3 == 0]
        graphs = backend.engine_work()
        backend.write_files(frame, tmp_path / "out", (), 64 * 2**20)
        assert len(list(marks.iterdir())) == 4  # each partition once
        assert backend.engine_work() - graphs == 2
        files = sorted((tmp_path / "out").rglob("*.parquet"))
        assert len(files) == 1 and pq.read_table(files[0])["n"].to_pylist() == list(range(0, 10_000, 3))
