"""Checks measured while an output is written (python's Arrow table, Dask's kept partitions, Ray's
materialized blocks, Polars' query that sinks it), and what Spark's and DuckDB's written files answer
of them (footers, dictionaries, key order; the engine the rest), agree exactly with the same checks
measured by the engine over the files written, on tables with planted defects, with keys in order
and out of order. Spark's observed write job, in object storage, is tested in
tests/objectstore/test_gcs_store.py."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.backends.checkplan import CheckPlan
from hybridflow.data.tables import TableSource
from hybridflow.definition.datachecks import read_checks
from hybridflow.execution.filechecks import measure as files_then_engine
from hybridflow.settings import TARGET_FILE_SIZE
from tests.support.engines import start_engines

MEASURING = ("python", "dask", "ray", "polars")  # the engines that measure a local output while writing
CHECKS = [{"not_null": ["customer", "week"]}, {"unique": ["customer", "week"]},
          {"range": {"column": "events", "min": 0, "max": 100}},
          {"accepted_values": {"column": "plan", "values": ["free", "pro"]}},
          {"null_fraction": {"column": "device", "max": 0.5}}, {"expr": "events < 50", "name": "small"},
          {"freshness": {"column": "seen", "max_age": "8d"}}, {"row_count": {"min": 1}}]
START = dt.datetime(2026, 11, 20, tzinfo=dt.timezone.utc)


def table(customers: list[int | None]) -> pa.Table:
    n = len(customers)
    return pa.table({
        "customer": pa.array(customers, pa.int64()),
        "week": pa.array([i % 2 for i in range(n)], pa.int32()),
        "events": pa.array([-1 if i == 3 else (None if i == 4 else i * 30) for i in range(n)], pa.int64()),
        "plan": pa.array(["free", "gold", None, "pro"] * (n // 4) + ["pro"] * (n % 4)),
        "device": pa.array([None if i % 3 == 0 else "ios" for i in range(n)]),
        "seen": pa.array([START + dt.timedelta(hours=i) for i in range(n)], pa.timestamp("us", "UTC")),
    })


TABLES = {
    "keys in order": table([i // 2 for i in range(12)]),  # (0,0), (0,1), (1,0), ...: rising, distinct
    "keys out of order, one repeated": table([5, 5, 1, None, 3, 3, 0, 0, 2, 2, 1, 4]),
}


def written_and_measured(backend, tmp_path, data: pa.Table, stage=lambda frame: frame):
    """`data` read by `backend`, passed through `stage` and written measuring CHECKS: (the checks, their
    plan, the measures taken while writing, the same measures over the files written)."""
    (tmp_path / "input").mkdir()
    pq.write_table(data, tmp_path / "input" / "part-0.parquet")
    checks, problems = read_checks(CHECKS, "weeks")
    assert not problems
    plan = CheckPlan(checks)
    (tmp_path / "out").mkdir()
    frame = backend.read(TableSource("input", (tmp_path / "input",), "parquet", data.schema, (), tmp_path / "input"))
    schema, measured = backend.write_measured(stage(frame), tmp_path / "out", (), TARGET_FILE_SIZE, plan)
    from_files = backend.check_measure(
        backend.check_frame(TableSource("weeks", (tmp_path / "out",), "parquet", schema, (), tmp_path / "out")), plan)
    return checks, plan, measured, from_files


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    running: dict = {}
    try:
        yield running
    finally:
        for engine in running.values():
            engine.stop()


@pytest.mark.parametrize("name", MEASURING)
@pytest.mark.parametrize("kind", TABLES)
def test_measures_taken_while_writing_equal_those_of_the_files(started, tmp_path, tmp_path_factory, name, kind):
    if name not in started:
        started.update(start_engines(tmp_path_factory.mktemp("engine-logs"), [name]))
    data = TABLES[kind]
    checks, plan, measured, from_files = written_and_measured(started[name], tmp_path, data)
    assert measured is not None
    assert measured == from_files
    distinct = len({(r["customer"], r["week"]) for r in data.to_pylist()})
    unique = next(c for c in checks if c.kind == "unique")
    assert measured[plan.alias[unique.name]] == distinct


@pytest.mark.parametrize("name", ["spark", "duckdb"])
@pytest.mark.parametrize("kind", TABLES)
def test_what_the_written_files_answer_equals_the_engines_own_measures(started, tmp_path, tmp_path_factory,
                                                                       name, kind):
    """Spark's and DuckDB's own Parquet (their writers' encodings and statistics): the footers, the
    plan column's dictionaries and the key's order answer what they can, the engine the rest."""
    if name not in started:
        started.update(start_engines(tmp_path_factory.mktemp("engine-logs"), [name]))
    data = TABLES[kind]
    checks, plan, measured, from_engine = written_and_measured(started[name], tmp_path, data)
    assert measured is None  # a local output: measured over the files written
    schema = pq.read_schema(next((tmp_path / "out").glob("*.parquet")))
    written = TableSource("weeks", (tmp_path / "out",), "parquet", schema, (), tmp_path / "out")
    assert utc(files_then_engine(started[name], written, plan)) == utc(from_engine)
    accepted = next(c for c in checks if c.kind == "accepted_values")
    assert from_engine[plan.alias[accepted.name]] == sum(p == "gold" for p in data["plan"].to_pylist())


def utc(values: dict) -> dict:
    """Measures with a naive timestamp (Spark's collect) read as UTC, as judging reads them."""
    return {k: v.replace(tzinfo=dt.timezone.utc) if isinstance(v, dt.datetime) and v.tzinfo is None else v
            for k, v in values.items()}


def test_polars_measures_the_rows_it_writes_when_the_stage_differs_each_time_it_runs(started, tmp_path,
                                                                                   tmp_path_factory):
    """A stage whose rows are not the same from one evaluation to the next (a sample with replacement):
    the measures taken while writing are those of the rows written, not of a second evaluation."""
    import polars as pl

    if "polars" not in started:
        started.update(start_engines(tmp_path_factory.mktemp("engine-logs"), ["polars"]))
    _, _, measured, from_files = written_and_measured(
        started["polars"], tmp_path, table(list(range(2000))),
        stage=lambda frame: frame.select(pl.all().sample(n=2000, with_replacement=True)))
    assert measured is not None
    assert measured == from_files
