"""The backend contract (hybridflow.testing.BackendContract) on Polars: every type, odd names, empty and
partitioned outputs handed off with the python engine each way and with itself. What Polars cannot hold
(wide decimals, date64, time32, fixed-size binary in a list) is refused in test_polars.py."""

from __future__ import annotations

from hybridflow.testing import BackendContract
from tests.support.engines import TEST_SETTINGS


class TestPolarsContract(BackendContract):
    engine = "polars"
    settings = TEST_SETTINGS["polars"]
