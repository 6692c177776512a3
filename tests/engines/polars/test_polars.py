"""What is Polars' own; the contract it shares with every engine (types both ways, empty, partitioned
and external inputs, target file size, errors) is tests/engines/test_backends.py and tests/engines/test_bad_inputs.py.

Stages get LazyFrames and return a LazyFrame or a DataFrame; partitioned and incremental outputs
come from Polars' own sink; a type Polars holds in another form is written back as it was read, and
what it cannot hold is refused naming the column; an output is cut into files of the target size; the
memory budget is set for the run and put back; a timeout or SIGTERM stops a long query at once."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import threading
import time
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow import backends
from hybridflow.backends.polars import BUDGET, SPILL, default_memory_limit
from hybridflow.data.contract import schema_differences
from hybridflow.data.tables import TableSource, read_arrow, write_arrow
from hybridflow.definition.config import load_pipeline
from hybridflow.engines.polars import PolarsSettings
from hybridflow.errors import DataError, StageError
from hybridflow.execution.runner import Runner
from hybridflow.store.catalog import Catalog
from tests.engines.test_faults import start, wait_for
from tests.engines.test_three_engines import finish
from tests.support.engines import assert_nothing_left
from tests.support.projects import last_run_record

pl = pytest.importorskip("polars")

STAGES = '''
import time

import polars as pl


def spend_lazy(events, ctx):
    assert isinstance(events, pl.LazyFrame) and ctx.polars_engine == "streaming"
    return events.group_by("customer").agg(pl.col("amount").sum()).sort("customer")


def spend_eager(events):
    return events.group_by("customer").agg(pl.col("amount").sum()).sort("customer").collect()


def per_day(raw, ctx):
    days = raw.select(pl.col("day").unique().sort()).collect()["day"].to_list()
    ctx.log.info("called for %s", ",".join(days))
    return raw.group_by("day").agg(pl.col("value").sum()).with_columns(run=pl.lit(ctx.run_id))


def endless(ctx):
    """Minutes of work for the streaming engine (200 batches, half a second each), in little memory."""
    ctx.log.info("waiting")
    rows = pl.LazyFrame({"x": pl.int_range(0, 20_000_000, eager=True)})
    return rows.with_columns(pl.col("x").map_batches(lambda batch: time.sleep(0.5) or batch, return_dtype=pl.Int64,
                                                         is_elementwise=True))
'''


@pytest.fixture(scope="module")
def polars_engine(tmp_path_factory):
    engine = backends.create("polars", PolarsSettings(memory_limit="1GB"), tmp_path_factory.mktemp("logs"))
    engine.start()
    yield engine
    engine.stop()


def source_of(directory, table: pa.Table) -> TableSource:
    directory.mkdir(parents=True)
    write_arrow(table, directory)
    return TableSource("t", tuple(sorted(directory.glob("*.parquet"))), "parquet", table.schema)


def written(engine, frame, directory, partition_by=(), target_file_size=128 * 10**6) -> pa.Schema:
    directory.mkdir()
    return engine.write(frame, directory, partition_by, target_file_size)


@pytest.mark.parametrize("function", ["spend_lazy", "spend_eager"])
def test_a_stage_returns_a_lazyframe_or_a_dataframe(project, function):
    project.stages(STAGES)
    data = project.root / "events"
    data.mkdir()
    pq.write_table(pa.table({"customer": [2, 1, 2], "amount": pa.array([Decimal("1.50"), None, Decimal("2.25")],
                                                                      pa.decimal128(10, 2))}), data / "a.parquet")
    path = project.pipeline(f'''
    name: spend
    root: .
    datasets:
      events: {{path: events}}
    stages:
      spend: {{run: "mypkg.steps:{function}", backend: polars, inputs: [events], outputs: [spend]}}
    ''')
    result = Runner(load_pipeline(path)).run()
    assert result.status == "success", result.error
    table = read_arrow(Catalog(project.home("spend")).current("spend").source())
    assert table.schema == pa.schema([("customer", pa.int64()), ("amount", pa.decimal128(38, 2))])
    assert table.to_pylist() == [{"customer": 1, "amount": Decimal("0.00")},
                                 {"customer": 2, "amount": Decimal("3.75")}]


HELPED = """
import polars as pl

from .scaling import Scale


def _plus_one(batch):  # a module-level helper of the stage's own module
    return batch + 1


def helped(events, factor: int):
    scale = Scale(factor)  # a class from a relative import, called through a closure
    return events.with_columns(
        pl.col("amount").map_batches(_plus_one, return_dtype=pl.Int64)
        .map_batches(lambda batch: scale(batch), return_dtype=pl.Int64).alias("scaled"))
"""


def test_a_query_runs_with_the_stage_module_s_helpers_classes_closures_and_relative_imports(project):
    project.stages(HELPED)
    project.write("mypkg/scaling.py", """
    class Scale:
        def __init__(self, factor):
            self.factor = factor

        def __call__(self, batch):
            return batch * self.factor
    """)
    data = project.root / "events"
    data.mkdir()
    pq.write_table(pa.table({"amount": pa.array([1, 2, None], pa.int64())}), data / "a.parquet")
    path = project.pipeline('''
    name: helped
    root: .
    datasets:
      events: {path: events}
    stages:
      helped: {run: "mypkg.steps:helped", backend: polars, inputs: [events], outputs: [out], params: {factor: 10}}
    ''')
    result = Runner(load_pipeline(path)).run()
    assert result.status == "success", result.error
    table = read_arrow(Catalog(project.home("helped")).current("out").source())
    assert table.column("scaled").to_pylist() == [20, 30, None]


def write_day(root, day: str, values: list[int]) -> None:
    folder = root / "raw" / f"day={day}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"value": pa.array(values, pa.int64())}), folder / "part-0.parquet")


def test_a_partitioned_output_is_rebuilt_only_for_new_and_changed_input_partitions(project):
    project.stages(STAGES)
    path = project.pipeline('''
    name: inc
    root: .
    datasets:
      raw: {path: raw, partition_by: [day], schema: {day: string, value: int64}}
      per_day: {partition_by: [day]}
    stages:
      agg: {run: "mypkg.steps:per_day", backend: polars, incremental: true, inputs: [raw], outputs: [per_day]}
    ''')
    for day, values in (("d1", [1, 2]), ("d2", [3]), ("d3", [4, 5])):
        write_day(project.root, day, values)
    assert Runner(load_pipeline(path)).run().status == "success"
    catalog = Catalog(project.home("inc"))
    first = read_arrow(catalog.current("per_day").source()).sort_by("day")
    assert first.column("value").to_pylist() == [3, 3, 9]
    assert sorted(p.name for p in catalog.current("per_day").directory.iterdir() if p.is_dir()) == \
        ["day=d1", "day=d2", "day=d3"]  # Hive-style, the partition column only in the paths

    write_day(project.root, "d4", [10])  # new
    write_day(project.root, "d2", [30, 1])  # changed
    result = Runner(load_pipeline(path)).run()
    assert result.status == "success", result.error
    assert result.stages["agg"].reason == "2 of 4 partitions of raw new or changed (day=d2, day=d4)"
    assert "called for d2,d4" in open(result.stages["agg"].log_path).read()
    second = read_arrow(catalog.current("per_day").source()).sort_by("day")
    assert second.column("value").to_pylist() == [3, 31, 9, 10]
    runs = dict(zip(second.column("day").to_pylist(), second.column("run").to_pylist()))
    assert runs["d1"] == first.column("run")[0].as_py() and runs["d2"] == result.run_id  # d1 kept, d2 rebuilt


UTC = dt.timezone.utc
# what Polars holds in another form than the Arrow type it read (times in nanoseconds, a fixed-size
# binary as binary, a +01:00 zone as Etc/GMT-1, strings and lists in their large forms), beside types
# outside the contract's core
HELD_OTHERWISE = pa.table({
    "t": pa.array([dt.time(1, 2, 3, 4), None, dt.time(23, 59, 59, 999999)], pa.time64("us")),
    "ts_offset": pa.array([dt.datetime(2026, 3, 29, 1, 30, tzinfo=UTC), None, dt.datetime(1969, 12, 31, tzinfo=UTC)],
                          pa.timestamp("us", "+01:00")),
    "ts_zone": pa.array([1, None, -(2**40)], pa.timestamp("us", "America/New_York")),
    "fixed": pa.array([b"ab", None, b"\x00\xff"], pa.binary(2)),
    "u64": pa.array([2**64 - 1, None, 0], pa.uint64()),
    "half": pa.array([1.5, None, -2.0], pa.float16()),
    "nothing": pa.array([None, None, None], pa.null()),
    "elapsed": pa.array([1, None, -5], pa.duration("us")),
    "pairs": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
    "nested": pa.array([{"t": 1000, "s": "x"}, None, {"t": None, "s": None}],
                       pa.struct([("t", pa.time64("us")), ("s", pa.string())])),
    "text": pa.array(["a", None, ""], pa.large_string()),
    "items": pa.array([[1, None], None, []], pa.large_list(pa.int32())),
})


def test_types_polars_holds_in_another_form_are_written_as_they_were_read(polars_engine, tmp_path):
    polars_engine.begin_stage(False, {}, None)
    schema = written(polars_engine, polars_engine.read(source_of(tmp_path / "src", HELD_OTHERWISE)), tmp_path / "out")
    [file] = (tmp_path / "out").rglob("*.parquet")
    declared = dict(zip(HELD_OTHERWISE.schema.names, HELD_OTHERWISE.schema.types))
    on_disk = pq.read_schema(file)  # what every reader reads and records
    assert schema_differences(declared, on_disk) == [] and schema_differences(declared, schema) == []
    assert on_disk.field("t").type == pa.time64("us") and on_disk.field("ts_offset").type.tz == "+01:00"
    assert on_disk.field("text").type == pa.string() and on_disk.field("items").type == pa.list_(pa.int32())
    back = pq.read_table(file)
    for name in HELD_OTHERWISE.column_names:
        assert back.column(name).to_pylist() == HELD_OTHERWISE.column(name).to_pylist(), name


def test_polars_types_are_written_in_their_standard_form(polars_engine, tmp_path):
    frame = pl.DataFrame({
        "kind": pl.Series(["a", None, "b"], dtype=pl.Categorical),
        "level": pl.Series(["lo", "hi", None], dtype=pl.Enum(["lo", "hi"])),
        "ms": pl.Series([dt.datetime(2026, 1, 1, 0, 0, 0, 1000), None, dt.datetime(1970, 1, 1)],
                        dtype=pl.Datetime("ms", "UTC")),
        "ns": pl.Series([dt.datetime(2026, 1, 1, 0, 0, 0, 7), None, dt.datetime(1900, 1, 1)], dtype=pl.Datetime("ns")),
    })
    polars_engine.begin_stage(False, {}, None)
    schema = written(polars_engine, frame.lazy(), tmp_path / "out")
    assert schema == pa.schema([("kind", pa.string()), ("level", pa.string()), ("ms", pa.timestamp("us", "UTC")),
                                ("ns", pa.timestamp("us"))])
    back = pq.read_table(next((tmp_path / "out").rglob("*.parquet")))
    assert back.schema.remove_metadata() == schema
    assert back.column("kind").to_pylist() == ["a", None, "b"]
    assert back.column("ns").to_pylist() == frame["ns"].to_list()


@pytest.mark.parametrize("column, message", [
    (pa.array([1], pa.decimal256(40, 2)), "column 'c': Polars decimals hold at most 38 digits, not 40"),
    (pa.array([0], pa.date64()), "column 'c': Polars has no date64[ms] type"),
    (pa.array([0], pa.time32("ms")), "column 'c': Polars has no time32[ms] type"),
    (pa.array([[b"ab"]], pa.list_(pa.binary(2))), "column 'c': Polars reads a fixed-size binary inside a list"),
])
def test_an_input_polars_cannot_hold_is_refused_naming_the_column(polars_engine, tmp_path, column, message):
    directory = tmp_path / "src"
    directory.mkdir()
    table = pa.table({"c": column})
    pq.write_table(table, directory / "a.parquet")
    with pytest.raises(DataError, match=re.escape(message)):
        polars_engine.read(TableSource("t", (directory / "a.parquet",), "parquet", table.schema))


@pytest.mark.parametrize("series, message", [
    (pl.Series("c", [1], dtype=pl.Int128), "column 'c': Polars Int128 has no Parquet type that every engine reads"),
    (pl.Series("c", [object()], dtype=pl.Object), "column 'c': Polars Object has no Parquet type"),
    (pl.Series("c", [dt.datetime(2026, 1, 1)], dtype=pl.Datetime("ns")).dt.offset_by("1ns"),
     "column 'c' holds timestamps finer than microseconds"),
])
def test_an_output_polars_cannot_write_for_every_engine_is_refused_naming_the_column(polars_engine, tmp_path,
                                                                                   series, message):
    polars_engine.begin_stage(False, {}, None)
    with pytest.raises(DataError, match=re.escape(message)):
        written(polars_engine, series.to_frame().lazy(), tmp_path / "out")


def test_an_output_parquet_barely_compresses_is_split_into_files_of_the_target_size(polars_engine, tmp_path):
    rows, width = 20_000, 200
    noise = pa.array([os.urandom(width) for _ in range(rows)], pa.binary())  # as large in Parquet as in memory
    source = source_of(tmp_path / "src", pa.table({"id": pa.array(range(rows), pa.int64()), "noise": noise}))
    target = rows * width // 5
    polars_engine.begin_stage(False, {}, None)
    written(polars_engine, polars_engine.read(source), tmp_path / "out", target_file_size=target)
    files = sorted((tmp_path / "out").rglob("*.parquet"))
    sizes = [f.stat().st_size for f in files]
    assert 4 <= len(files) <= 7 and max(sizes) < 1.5 * target, sizes
    assert pq.read_table([str(f) for f in files]).sort_by("id").column("id").to_pylist() == list(range(rows))


def test_the_memory_budget_and_spill_directory_hold_for_the_engine_and_are_put_back(tmp_path, monkeypatch):
    monkeypatch.delenv(BUDGET, raising=False)
    monkeypatch.setenv(SPILL, "/somewhere/else")
    engine = backends.create("polars", PolarsSettings(memory_limit="3GiB"), tmp_path / "logs")
    engine.start()
    try:
        spill = tmp_path / "logs" / "polars-spill"
        assert os.environ[BUDGET] == "3072" and os.environ[SPILL] == str(spill)
        assert spill.is_dir() and spill.stat().st_mode & 0o777 == 0o700
    finally:
        engine.stop()
    assert BUDGET not in os.environ and os.environ[SPILL] == "/somewhere/else"
    assert not spill.exists()
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < default_memory_limit() <= total // 2


def test_a_cancel_from_another_thread_ends_the_write_and_its_query_at_once(polars_engine, tmp_path):
    batches = tmp_path / "batches"

    def slow(batch):  # a closure: it goes to the query's process with the plan
        with batches.open("a") as out:
            out.write(".")
        time.sleep(0.5)
        return batch

    # about 5 s of work: 20 batches of half a second, two at a time
    query = pl.LazyFrame({"x": pl.int_range(0, 2_000_000, eager=True)})
    query = query.with_columns(pl.col("x").map_batches(slow, return_dtype=pl.Int64, is_elementwise=True))

    def cancel_once_the_query_runs() -> None:  # its first batch began: however long its process took to start
        deadline = time.monotonic() + 120
        while not batches.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        polars_engine.cancel()

    canceller = threading.Thread(target=cancel_once_the_query_runs)
    canceller.start()
    polars_engine.begin_stage(False, {}, None)
    try:
        with pytest.raises(StageError, match="the polars query was cancelled"):
            written(polars_engine, query, tmp_path / "out")
    finally:
        canceller.join()
    done = batches.read_text()
    # at once: the batches begun are at most those of about 2 s after the cancel (four a second), not all 20
    assert 1 <= len(done) <= 10, f"{len(done)} of the query's 20 batches began"
    time.sleep(1.5)
    assert batches.read_text() == done  # the query stopped with the stage: no batch began since
    # and the next write runs on a new query process
    assert written(polars_engine, pl.LazyFrame({"x": [1, 2]}), tmp_path / "again").names == ["x"]


def stage_waiting(project):
    def found() -> bool:
        logs = sorted(project.home("stopping").glob("runs/*/logs/work.log"))
        return bool(logs) and "waiting" in logs[-1].read_text()
    return found


@pytest.mark.parametrize("stop, code", [("timeout", 124), (signal.SIGTERM, 143)], ids=["timeout", "sigterm"])
def test_a_long_query_is_stopped_promptly_by_a_timeout_or_a_signal(project, stop, code):
    project.stages(STAGES)
    project.pipeline(f'''
    name: stopping
    stages:
      work: {{run: "mypkg.steps:endless", backend: polars, outputs: [out]{", timeout: 3" if stop == "timeout" else ""}}}
    ''')
    process, marker = start(project)
    wait_for(stage_waiting(project), "the stage to build its query", process, seconds=120)
    clock = time.monotonic()
    if stop != "timeout":
        process.send_signal(stop)
    output = finish(process, 120, f"the run after {stop}")
    assert process.returncode == code, output
    # the query runs for minutes: the stop killed it (a bound wide enough for a slow, busy machine)
    assert time.monotonic() - clock < 30, output
    assert_nothing_left(marker, 30)
    run, stages = last_run_record(project.root / ".hybridflow")
    assert run["status"] == ("failed" if stop == "timeout" else "interrupted"), run
    assert stages["work"]["status"] == "failed"
    assert not (project.home("stopping") / "datasets" / "out").exists()  # nothing published
