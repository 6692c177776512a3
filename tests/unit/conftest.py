"""The unit tier stays the tier a contributor runs on every save: a test here that brings an engine's
library into the test process fails, naming the tier it belongs in."""

from __future__ import annotations

import sys

import pytest

ENGINE_LIBRARIES = ("pyspark", "dask", "distributed", "ray", "duckdb", "polars", "cudf")


@pytest.fixture(autouse=True)
def no_engine_library_is_imported():
    before = {name for name in ENGINE_LIBRARIES if name in sys.modules}
    yield
    imported = [name for name in ENGINE_LIBRARIES if name in sys.modules and name not in before]
    if imported:
        pytest.fail(f"this unit test imported {', '.join(imported)}: a test that needs an engine belongs in "
                    "tests/engines/ (or tests/runs/ for whole runs on the in-process engines)", pytrace=False)
