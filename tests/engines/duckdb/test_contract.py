"""The backend contract (hybridflow.testing.BackendContract) on DuckDB: every type, odd names, empty and
partitioned outputs handed off with the python engine each way and with itself. What DuckDB cannot hold
(half floats, durations, names that differ only by case) is refused in test_duckdb.py."""

from __future__ import annotations

from hybridflow.testing import BackendContract
from tests.support.engines import TEST_SETTINGS


class TestDuckDBContract(BackendContract):
    engine = "duckdb"
    settings = TEST_SETTINGS["duckdb"]
