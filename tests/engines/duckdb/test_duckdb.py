"""What is DuckDB's own (the backend contract runs on it in test_backends): stages that return a
relation, an Arrow table or a pandas frame; partitioned and incremental outputs; a timeout or a stop
request interrupting a running query; the memory limit, threads and spill directory it runs with;
DuckDB types written losslessly or refused by name; SQL stages; `hybridflow init --engines duckdb`."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from hybridflow import backends
from hybridflow.backends.duckdb import default_memory_limit
from hybridflow.data.tables import TableSource, read_arrow, write_arrow
from hybridflow.definition.config import load_pipeline
from hybridflow.engines.duckdb import DuckDBSettings
from hybridflow.errors import DataError, ExitCode
from hybridflow.execution.runner import Runner
from hybridflow.store.catalog import Catalog
from tests.support.projects import last_run_record

pytest.importorskip("duckdb")

ROOT = Path(__file__).resolve().parents[3]

STAGES = '''
import pyarrow as pa


def as_relation(events, ctx):
    import duckdb
    assert isinstance(events, duckdb.DuckDBPyRelation) and ctx.duckdb is not None
    return events.filter("amount >= 10").project("id, amount * 2 AS doubled")


def as_arrow(events):
    return pa.RecordBatchReader.from_stream(events.filter("amount >= 10")).read_all()


def as_pandas(events):
    frame = events.df()
    return frame[frame["amount"] >= 10].set_index("id")  # a named index is data


def agg(raw, ctx):
    days = sorted(row[0] for row in raw.project("day").distinct().fetchall())
    ctx.log.info("called for %s", ",".join(days))
    return raw.aggregate("day, sum(value) AS value, count(*) AS rows", "day")


def settings(ctx):
    return ctx.duckdb.sql("SELECT current_setting('memory_limit') AS memory_limit, "
                          "current_setting('temp_directory') AS temp_directory, "
                          "current_setting('threads') AS threads")


def endless_at_the_write(ctx):  # the query runs when hybridflow writes the output
    return ctx.duckdb.sql("SELECT sum(a.range * b.range) AS s FROM range(1000000000) a, range(1000000000) b")


def endless_in_the_stage(ctx):
    import threading
    import time

    def say_when_it_runs():  # DuckDB's own progress of the query: running, not about to run
        while ctx.duckdb.query_progress() < 0:
            time.sleep(0.02)
        ctx.log.info("the query is running")

    threading.Thread(target=say_when_it_runs, daemon=True).start()
    return ctx.duckdb.sql("SELECT sum(a.range * b.range) AS s FROM range(1000000000) a, "
                          "range(1000000000) b").fetchall()
'''


def events_table() -> pa.Table:
    return pa.table({"id": pa.array(range(1, 7), pa.int64()),
                     "amount": pa.array([5.0, 10.0, 25.5, None, 12.0, 1.0]),
                     "day": pa.array([dt.date(2026, 11, 16)] * 6)})


@pytest.fixture
def duck(project):
    project.stages(STAGES)
    data = project.root / "data"
    data.mkdir()
    pq.write_table(events_table(), data / "events.parquet")
    return project


def run(project, pipeline: str, *args: str, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", pipeline, *args], cwd=project.root,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def published(project, pipeline: str, dataset: str) -> pa.Table:
    return read_arrow(Catalog(project.home(pipeline)).current(dataset).source())


def test_a_stage_returns_a_relation_an_arrow_table_or_a_pandas_frame(duck):
    path = duck.pipeline('''
    name: frames
    root: .
    datasets:
      events: {path: data/events.parquet}
    stages:
      relation: {run: "mypkg.steps:as_relation", backend: duckdb, inputs: [events], outputs: [by_relation]}
      arrow: {run: "mypkg.steps:as_arrow", backend: duckdb, inputs: [events], outputs: [by_arrow]}
      pandas: {run: "mypkg.steps:as_pandas", backend: duckdb, inputs: [events], outputs: [by_pandas]}
    ''')
    result = Runner(load_pipeline(path)).run()
    assert result.status == "success", result.error
    by_relation = published(duck, "frames", "by_relation").sort_by("id")
    assert by_relation.schema == pa.schema([("id", pa.int64()), ("doubled", pa.float64())])
    assert by_relation.column("doubled").to_pylist() == [20.0, 51.0, 24.0]
    expected = events_table().filter(pc.greater_equal(events_table()["amount"], 10.0))
    for name in ("by_arrow", "by_pandas"):
        table = published(duck, "frames", name).sort_by("id")
        assert table.schema.names == ["id", "amount", "day"], name
        assert table.select(expected.schema.names).cast(expected.schema).equals(expected), name


INCREMENTAL = '''
name: inc
root: .
datasets:
  raw: {path: raw, partition_by: [day], schema: {day: string, value: int64}}
  per_day: {partition_by: [day]}
stages:
  agg: {run: "mypkg.steps:agg", backend: duckdb, incremental: true, inputs: [raw], outputs: [per_day]}
'''


def write_day(root: Path, day: str, values: list[int]) -> None:
    folder = root / "raw" / f"day={day}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"value": pa.array(values, pa.int64())}), folder / "part-0.parquet")


def test_a_partitioned_output_is_written_and_kept_incrementally(duck):
    duck.pipeline(INCREMENTAL)
    for day, values in (("d1", [1, 2]), ("d2", [3]), ("d 3/x", [4, 5])):
        write_day(duck.root, day.replace("/", "%2F"), values)
    first = run(duck, "pipeline.yaml")
    assert first.returncode == 0, first.stderr
    version = Catalog(duck.home("inc")).current("per_day")
    assert sorted(p.name for p in version.directory.iterdir() if p.is_dir()) == ["day=d 3%2Fx", "day=d1", "day=d2"]
    table = published(duck, "inc", "per_day").sort_by("day")
    assert table.schema.field("day").type == pa.string() and table.schema.field("rows").type == pa.int64()
    assert table.column("value").to_pylist() == [9, 3, 3] and table.column("day").to_pylist() == ["d 3/x", "d1", "d2"]

    write_day(duck.root, "d4", [10])  # new
    write_day(duck.root, "d2", [30, 1])  # changed
    second = run(duck, "pipeline.yaml")
    assert second.returncode == 0, second.stderr
    _, stages = last_run_record(duck.root / ".hybridflow")
    assert "called for d2,d4" in Path(stages["agg"]["log_path"]).read_text()
    table = published(duck, "inc", "per_day").sort_by("day")
    assert dict(zip(table.column("day").to_pylist(), table.column("value").to_pylist())) == {
        "d 3/x": 9, "d1": 3, "d2": 31, "d4": 10}


@pytest.mark.parametrize("function", ["endless_at_the_write", "endless_in_the_stage"])
def test_a_timeout_interrupts_the_running_query(duck, function):
    duck.pipeline(f'''
    name: endless
    stages:
      work: {{run: "mypkg.steps:{function}", backend: duckdb, outputs: [out], timeout: 2}}
    ''')
    done = run(duck, "pipeline.yaml", timeout=120)  # the query never ends by itself
    assert done.returncode == ExitCode.TIMEOUT == 124, done.stderr
    # the query was interrupted, not waited for: not the run ended around a stage stuck in it
    assert "timed out after 2s; its engine work was cancelled" in done.stderr + done.stdout, done.stderr
    assert not (duck.home("endless") / "datasets" / "out").exists()


def test_sigint_interrupts_the_running_query(duck):
    duck.pipeline('''
    name: endless
    stages:
      work: {run: "mypkg.steps:endless_in_the_stage", backend: duckdb, outputs: [out]}
    ''')
    process = subprocess.Popen([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml"], cwd=duck.root,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 120
        while not any("the query is running" in p.read_text() for p in duck.root.rglob("logs/work.log")):
            assert time.monotonic() < deadline and process.poll() is None, "the stage never started its query"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)  # the query would run for hours: a guard for a slow machine, not a bound
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, process.stderr.read()


def test_memory_limit_threads_and_spill_directory_are_applied(duck, tmp_path):
    spill = tmp_path / "spill"
    path = duck.pipeline(f'''
    name: settings
    backends:
      duckdb: {{memory_limit: 1GB, threads: 1, temp_directory: {spill}}}
    stages:
      settings: {{run: "mypkg.steps:settings", backend: duckdb, outputs: [chosen]}}
    ''')
    assert Runner(load_pipeline(path)).run().status == "success"
    row = published(duck, "settings", "chosen").to_pylist()[0]
    assert row == {"memory_limit": "953.6 MiB", "temp_directory": str(spill), "threads": 1}


def test_by_default_it_takes_three_quarters_of_the_memory_and_spills_under_the_runs_logs(duck):
    import duckdb

    path = duck.pipeline('''
    name: defaults
    stages:
      settings: {run: "mypkg.steps:settings", backend: duckdb, outputs: [chosen]}
    ''')
    result = Runner(load_pipeline(path)).run()
    assert result.status == "success", result.error
    row = published(duck, "defaults", "chosen").to_pylist()[0]
    expected = duckdb.connect(config={"memory_limit": f"{default_memory_limit()}B"})
    assert row["memory_limit"] == expected.sql("SELECT current_setting('memory_limit')").fetchall()[0][0]
    assert row["threads"] == len(os.sched_getaffinity(0))
    spill = Path(row["temp_directory"])
    assert spill.name == "duckdb-spill" and spill.parent.name == "logs" and result.run_id in str(spill)
    assert not spill.exists()  # removed when the engine stopped


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    started = backends.create("duckdb", DuckDBSettings(threads=2, memory_limit="1GB"),
                              tmp_path_factory.mktemp("logs"))
    started.start()
    yield started
    started.stop()


def write(engine, relation, directory: Path, partition_by=()) -> tuple[pa.Schema, pa.Table]:
    directory.mkdir()
    schema = engine.write(relation, directory, partition_by)
    return schema, pq.read_table(directory)


def test_duckdb_types_without_a_parquet_twin_are_written_as_its_arrow_export_gives_them(engine, tmp_path):
    engine.con.execute("CREATE TYPE IF NOT EXISTS mood AS ENUM ('sad', 'happy')")
    relation = engine.con.sql("""
        SELECT (2::HUGEINT ** 100)::HUGEINT AS huge, 7::UHUGEINT AS uhuge,
               '00000000-0000-0000-0000-000000000001'::UUID AS id, '{"a": 1}'::JSON AS doc, 'happy'::mood AS mood,
               '2026-01-01 10:00:00.123'::TIMESTAMP_MS AS ms, '2026-01-01 10:00:00.123456'::TIMESTAMP_NS AS ns,
               [1, 2]::INTEGER[2] AS pair, MAP {'k': 1::HUGEINT} AS m,
               {'id': '00000000-0000-0000-0000-000000000002'::UUID, 'n': 1::HUGEINT} AS nested""")
    schema, table = write(engine, relation, tmp_path / "out")
    assert table.schema.field("huge").type == pa.decimal128(38, 0)
    assert table.column("huge").to_pylist() == [Decimal(2**100)]
    assert table.schema.field("id").type == pa.string() and table.schema.field("doc").type == pa.string()
    assert table.column("mood").to_pylist() == ["happy"]
    assert table.schema.field("ms").type == pa.timestamp("us") and table.schema.field("ns").type == pa.timestamp("us")
    assert table.column("ns").to_pylist() == [dt.datetime(2026, 1, 1, 10, 0, 0, 123456)]
    assert pa.types.is_list(table.schema.field("pair").type) and table.column("pair").to_pylist() == [[1, 2]]
    assert table.column("nested").to_pylist() == [{"id": "00000000-0000-0000-0000-000000000002", "n": Decimal(1)}]
    assert all(field.nullable for field in table.schema)  # constants too: every file of a dataset alike
    assert schema == standard(table.schema)  # what is on disk


def standard(schema: pa.Schema) -> pa.Schema:
    from hybridflow.data.contract import standard_schema

    return standard_schema(schema)


@pytest.mark.parametrize("query, message", [
    ("SELECT '2026-01-01 10:00:00.123456789'::TIMESTAMP_NS AS ns",
     "column 'ns' holds timestamps finer than microseconds"),
    ("SELECT 1 AS ok, INTERVAL 3 DAY AS \"odd.name\"", "column 'odd.name': INTERVAL has no Parquet type"),
    ("SELECT '12:00:00+01'::TIMETZ AS t", "column 't': TIME WITH TIME ZONE would lose its offset"),
])
def test_what_parquet_cannot_hold_exactly_is_refused_naming_the_column(engine, tmp_path, query, message):
    (tmp_path / "out").mkdir()
    with pytest.raises(DataError, match=message):
        engine.write(engine.con.sql(query), tmp_path / "out")


@pytest.mark.parametrize("column, message", [
    ({"h": pa.array([1.5], pa.float16())}, "column 'h': DuckDB has no halffloat type"),
    ({"d": pa.array([5], pa.duration("s"))}, "column 'd': DuckDB has no duration"),
    ({"x": pa.array([1], pa.int64()), "X": pa.array([2], pa.int64())}, "columns 'x' and 'X' differ only by case"),
])
def test_what_duckdb_cannot_hold_is_refused_on_read_naming_the_column(engine, tmp_path, column, message):
    table = pa.table(column)
    write_arrow(table, tmp_path)
    source = TableSource("t", tuple(tmp_path.glob("*.parquet")), "parquet", table.schema)
    with pytest.raises(DataError, match=message):
        engine.read(source)
    assert any(message.split(": ", 1)[-1] in p for p in backends.engine("duckdb").unrepresentable(table.schema))


def test_progress_is_the_running_querys_percentage_and_cancel_interrupts_it(engine):
    import duckdb

    failure: list[BaseException] = []

    def endless() -> None:
        try:
            engine.con.sql("SELECT sum(a.range * b.range) FROM range(100000000) a, range(100000000) b").fetchall()
        except duckdb.Error as exc:
            failure.append(exc)

    worker = threading.Thread(target=endless)
    worker.start()
    phrases = []
    deadline = time.monotonic() + 30
    while not phrases and time.monotonic() < deadline:
        time.sleep(0.2)
        phrases = [p for p in [engine.progress()] if p]
    engine.cancel()
    worker.join(10)
    assert not worker.is_alive() and isinstance(failure[0], duckdb.InterruptException)
    assert phrases and phrases[0].startswith("query ") and phrases[0].endswith("%")
    assert engine.progress() is None  # between queries


def test_a_sql_stage_runs_on_duckdb_with_its_params_bound(duck):
    duck.write("sql/big.sql", "SELECT id, amount FROM events WHERE amount >= :min_amount ORDER BY id\n")
    path = duck.pipeline('''
    name: sql
    root: .
    datasets:
      events: {path: data/events.parquet}
    stages:
      big: {run: sql/big.sql, backend: duckdb, inputs: [events], outputs: [big], params: {min_amount: 12}}
    ''')
    result = Runner(load_pipeline(path)).run()
    assert result.status == "success", result.error
    assert published(duck, "sql", "big").column("id").to_pylist() == [3, 5]


def test_a_run_of_sql_stages_never_imports_pandas(duck):
    """pandas takes about half a second to import: a pipeline whose stages are all queries does without it
    (a stage that returns a DataFrame has imported it itself)."""
    duck.write("sql/big.sql", "SELECT id, amount FROM events WHERE amount >= 12\n")
    duck.write("sql/total.sql", "SELECT CAST(SUM(amount) AS DOUBLE) AS total FROM big\n")
    duck.pipeline('''
    name: sql
    root: .
    datasets:
      events: {path: data/events.parquet}
    stages:
      big: {run: sql/big.sql, backend: duckdb, inputs: [events], outputs: [big]}
      total: {run: sql/total.sql, backend: duckdb, inputs: [big], outputs: [total]}
    ''')
    script = ("import sys, hybridflow; result = hybridflow.run('pipeline.yaml'); "
              "print(result.status, 'pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], cwd=duck.root, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.split() == ["success", "False"], done.stderr[-2000:]
    assert published(duck, "sql", "total").column("total").to_pylist() == [37.5]


def test_init_writes_a_duckdb_stage_that_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    made = subprocess.run([sys.executable, "-m", "hybridflow.cli", "init", "proj", "--engines", "duckdb"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60)
    assert made.returncode == 0, made.stderr
    ran = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml"], cwd=tmp_path / "proj",
                         capture_output=True, text=True, env=env, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    totals = read_arrow(Catalog(tmp_path / "proj" / ".hybridflow" / "proj").current("totals").source())
    assert totals.num_rows > 0
    assert totals.schema.names == ["event_id", "customer_id", "amount", "kind", "customer_spend"]
    rows = totals.to_pandas()
    assert rows["customer_spend"].tolist() == rows.groupby("customer_id")["amount"].transform("sum").tolist()
