"""The backend contract (hybridflow.testing.BackendContract) on the python engine, which is also the
reference engine every other engine is held against: here it hands off to itself (pyarrow reads and
writes every file). Its pairs with the other engines are in their own test_contract.py modules."""

from __future__ import annotations

from hybridflow.testing import BackendContract
from tests.support.engines import TEST_SETTINGS


class TestPythonContract(BackendContract):
    engine = "python"
    settings = TEST_SETTINGS["python"]
