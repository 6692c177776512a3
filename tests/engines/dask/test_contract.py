"""The backend contract (hybridflow.testing.BackendContract) on an embedded Dask cluster: every type,
odd names, empty and partitioned outputs handed off with the python engine each way and with itself."""

from __future__ import annotations

from hybridflow.testing import BackendContract
from tests.support.engines import TEST_SETTINGS


class TestDaskContract(BackendContract):
    engine = "dask"
    settings = TEST_SETTINGS["dask"]
