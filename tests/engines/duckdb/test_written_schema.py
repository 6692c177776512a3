"""The schema a DuckDB write reports: read from the footer it just wrote for an unpartitioned output
(no second run of the query's plan), the relation's own for a partitioned one (its partition
columns are in no file). Either is exactly what DuckDB's Arrow export gives for the written types."""

from __future__ import annotations

import pyarrow as pa
import pytest

from hybridflow import backends
from hybridflow.backends.duckdb import arrow_schema, write_expression
from hybridflow.engines.duckdb import DuckDBSettings

EVERY_TYPE = """
    SELECT 1::TINYINT AS i8, 2::UTINYINT AS u8, 3::SMALLINT AS i16, 4::UINTEGER AS u32, 5::UBIGINT AS u64,
           6::HUGEINT AS huge, 1.5::FLOAT AS f32, 2.5::DOUBLE AS f64, 1.25::DECIMAL(18, 4) AS d18,
           1.25::DECIMAL(38, 10) AS d38, 'x' AS s, 'x'::BLOB AS b, true AS flag, DATE '2026-01-01' AS day,
           TIME '01:02:03' AS t, TIMESTAMP '2026-01-01 10:00:00' AS ts, TIMESTAMPTZ '2026-01-01 10:00:00+00' AS tz,
           TIMESTAMP_MS '2026-01-01 10:00:00' AS ms, TIMESTAMP_NS '2026-01-01 10:00:00' AS ns, [1, 2] AS list,
           {'u': 1, 'v': 'w'} AS struct, MAP {'k': 1} AS m, [{'a': [1]}] AS deep, uuid() AS id,
           [1, 2, 3]::INTEGER[3] AS fixed, NULL::INTEGER AS nothing, 'p' || (range % 2)::VARCHAR AS part
    FROM range(4)"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    started = backends.create("duckdb", DuckDBSettings(threads=2, memory_limit="1GB"),
                              tmp_path_factory.mktemp("logs"))
    started.start()
    yield started
    started.stop()


def exported(engine, query: str) -> pa.Schema:
    relation = engine.con.sql(query)
    return arrow_schema(relation.project(", ".join(map(write_expression, relation.columns, relation.types))))


@pytest.mark.parametrize("rows", ["", " LIMIT 0"])
def test_an_unpartitioned_output_reports_its_footers_schema_which_is_duckdbs_arrow_export(engine, tmp_path, rows):
    (tmp_path / "out").mkdir()
    written = engine.write(engine.con.sql(EVERY_TYPE + rows), tmp_path / "out")
    assert written == exported(engine, EVERY_TYPE + rows)
    assert all(field.nullable for field in written)


def test_a_partitioned_output_reports_its_partition_columns_too(engine, tmp_path):
    (tmp_path / "out").mkdir()
    written = engine.write(engine.con.sql(EVERY_TYPE), tmp_path / "out", ("part",))
    assert written == exported(engine, EVERY_TYPE)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["part=p0", "part=p1"]
