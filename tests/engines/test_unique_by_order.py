"""A unique check's distinct keys on DuckDB, Polars and Spark, which prove keys distinct by their order
(each above the row's before) without hashing them and count them only where the order does not prove
it: exact whatever the order, NULLs, NaN and -0.0, over the written files, on Polars as the output is
written, and on Spark from its local files' key columns, read back a row group at a time."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.backends.checkplan import CheckPlan
from hybridflow.data.tables import TableSource
from hybridflow.definition.datachecks import read_checks
from hybridflow.execution.filechecks import measure as files_then_engine
from hybridflow.settings import TARGET_FILE_SIZE
from tests.support.engines import start_engines

NAN = float("nan")
KEYS = {
    "rising in the second column": [(1, 0.0), (1, 2.0), (2, 0.0), (3, -1.0)],
    "rising, then a repeat": [(1, 0.0), (2, 0.0), (3, 0.0), (3, 0.0)],
    "a repeat apart, in no order": [(3, 0.0), (1, 0.0), (3, 0.0), (2, 0.0)],
    "descending": [(3, 0.0), (2, 0.0), (1, 0.0)],
    "NULLs, one value": [(1, None), (1, None), (None, 2.0), (None, 2.0)],
    "NULL rising after keys": [(1, 0.0), (2, None), (3, 0.0)],
    "NaN rising, NaN repeated, -0.0 and 0.0": [(1, 0.0), (1, NAN), (1, NAN), (2, -0.0), (2, 0.0)],
    "strings rising": [("a", 1.0), ("b", 1.0), ("bb", 0.0)],
    "no row": [],
}


def table(keys: list[tuple]) -> pa.Table:
    first = pa.string() if keys and isinstance(keys[0][0], str) else pa.int64()
    return pa.table({"customer": pa.array([k[0] for k in keys], first),
                     "week": pa.array([k[1] for k in keys], pa.float64())})


def distinct(keys: list[tuple]) -> int:
    """As the engines count keys: NULL one value, NaN one value, -0.0 the same as 0.0."""
    def same(value):
        return "nan" if isinstance(value, float) and value != value else (0.0 if value == 0 else value)
    return len({tuple(same(v) for v in k) for k in keys})


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    running = start_engines(tmp_path_factory.mktemp("engine-logs"), ["duckdb", "polars", "spark"])
    try:
        yield running
    finally:
        for engine in running.values():
            engine.stop()


@pytest.mark.parametrize("name", ["duckdb", "polars", "spark"])
@pytest.mark.parametrize("case", KEYS)
def test_distinct_keys_are_exact_in_any_order(started, tmp_path, name, case):
    backend, data = started[name], table(KEYS[case])
    (tmp_path / "input").mkdir()
    pq.write_table(data, tmp_path / "input" / "part-0.parquet")
    checks, problems = read_checks([{"unique": ["customer", "week"]}, {"row_count": {"min": 0}}], "keys")
    assert not problems
    plan = CheckPlan(checks)
    alias = plan.alias[checks[0].name]
    (tmp_path / "out").mkdir()
    frame = backend.read(TableSource("input", (tmp_path / "input",), "parquet", data.schema, (), tmp_path / "input"))
    schema, measured = backend.write_measured(frame, tmp_path / "out", (), TARGET_FILE_SIZE, plan)
    from_files = backend.check_measure(
        backend.check_frame(TableSource("keys", (tmp_path / "out",), "parquet", schema, (), tmp_path / "out")), plan)
    assert from_files[alias] == distinct(KEYS[case])
    if name == "polars":  # measured in the query that wrote them
        assert measured == from_files
    if name == "spark":  # a local output: its files' key order answers, else a Spark job counts them
        assert measured is None
        written = TableSource("keys", (tmp_path / "out",), "parquet", schema, (), tmp_path / "out")
        assert files_then_engine(backend, written, plan)[alias] == distinct(KEYS[case])
