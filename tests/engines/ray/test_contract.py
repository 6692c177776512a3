"""The backend contract (hybridflow.testing.BackendContract) on embedded Ray (Ray Data): every type,
odd names, empty and partitioned outputs handed off with the python engine each way and with itself."""

from __future__ import annotations

from hybridflow.testing import BackendContract
from tests.support.engines import TEST_SETTINGS


class TestRayContract(BackendContract):
    engine = "ray"
    settings = TEST_SETTINGS["ray"]
