"""The engines held to each other, all six started once for the module (one session per engine keeps
this fast on two cores): what no engine's own contract can show alone.

Each engine's own contract (hybridflow.testing.BackendContract, run by tests/engines/<engine>/test_contract.py
and by the plugin engine's test) hands every type, odd column names, partitioned and odd-partitioned
outputs off with itself and with the reference (python) engine each way, and publishes an empty output
locally. Here are the rest of the (writer, reader) pairs, PAIRS: two different engines, neither the
reference, for the same tables. Then what needs every engine at once: every type and partitioned outputs
through a workdir in object storage (a moto S3 server) for every (writer, reader) pair, empty outputs and
odd partition spellings there; and the stage-level contract on every engine: native frames in and out of
a stage, a failure in user code reported as the user's own error, external CSV, JSON lines and Parquet
inputs typed by their declared schema, outputs written as files of the target size, and column pruning
reaching the files."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.data.contract import schema_differences
from hybridflow.data.storage import ObjectPath
from hybridflow.data.tables import TableSource, read_arrow
from hybridflow.definition.config import load_pipeline
from hybridflow.errors import DataError, ExitCode
from hybridflow.execution.runner import Runner
from hybridflow.store.catalog import Catalog
from hybridflow.testing import (
    ODD_PARTITION,
    ODD_PARTITION_DIRECTORIES,
    ODD_PARTITIONED,
    PARTITIONED,
    PARTITIONED_DIRECTORIES,
    BackendContract,
    assert_same,
    every_type_table,
    hand_off,
    odd_names_table,
    publish_through,
    source_of,
)
from tests.support.engines import ENGINES, engines_for_module
from tests.support.projects import Project
from tests.support.s3server import S3Server

EXPECTED = every_type_table()
ODD_NAMES = odd_names_table()
# The (writer, reader) pairs each engine's own contract leaves to this module: an engine with itself and
# with the reference engine are there (tests/engines/<engine>/test_contract.py), every other pair is here.
PAIRS = [(writer, reader) for writer in ENGINES for reader in ENGINES
         if writer != reader and BackendContract.reference not in (writer, reader)]


@pytest.fixture(scope="module")
def shared_project(tmp_path_factory):
    """One project for the module: its stage package is shipped to the engines' workers once."""
    project = Project(tmp_path_factory.mktemp("contract"))
    project.stages(STAGES)
    return project


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A real S3 server (moto) for the object-storage layout, its AWS variables in the environment
    before the engines start, as a user's would be (Dask's and Ray's workers read credentials there)."""
    import os

    server = S3Server(tmp_path_factory.mktemp("s3") / "moto.log").start()
    saved = {name: os.environ.get(name) for name in server.env()}
    os.environ.update(server.env())
    try:
        server.bucket("contract")
        yield server
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
        server.stop()


@pytest.fixture(scope="module")
def engines(tmp_path_factory, shared_project, s3):
    from hybridflow.data.stores.s3 import S3Settings

    yield from engines_for_module(tmp_path_factory, shared_project, store=S3Settings.of())


@pytest.fixture(scope="module")
def written_by(engines, tmp_path_factory):
    """What each engine writes of a table (EXPECTED unless told), handed off once per writer for the
    module: the readers' tests of a writer start from the same write (one code path, not one per reader)."""
    written: dict[tuple[str, tuple[str, ...]], pa.Table] = {}

    def write(writer: str, table: pa.Table = EXPECTED) -> pa.Table:
        key = writer, tuple(table.schema.names)
        if key not in written:
            base = tmp_path_factory.mktemp(f"written-{writer}")
            written[key] = hand_off(engines[writer], source_of(base / "src", table), base / "written")
        return written[key]
    return write


@pytest.mark.parametrize("writer, reader", PAIRS)
def test_every_type_survives_every_writer_reader_pair(engines, written_by, tmp_path, writer, reader):
    written = written_by(writer)
    assert_same(written, EXPECTED)
    again = hand_off(engines[reader], source_of(tmp_path / "mid", written), tmp_path / "read")
    assert_same(again, EXPECTED)


# -- the same contract on a workdir in object storage: published there, read back by every engine --------


@pytest.fixture(scope="module")
def s3_layout(s3):
    """A catalog factory for a workdir in object storage on the module's S3 server."""
    from hybridflow.data.storage import ObjectPath
    from hybridflow.data.stores.s3 import S3Settings
    from hybridflow.data.stores.s3objects import S3ObjectStore
    from hybridflow.store.objectcatalog import ObjectCatalog

    settings = S3Settings.of()
    return lambda base: ObjectCatalog(base / "home", ObjectPath(f"contract/{base.name}"), S3ObjectStore(settings))


@pytest.fixture(scope="module")
def published_to_s3(engines, s3_layout, tmp_path_factory):
    """EXPECTED written by each engine and published to the object-storage workdir, once per writer."""
    published: dict[str, object] = {}

    def publish(writer: str):
        if writer not in published:
            base = tmp_path_factory.mktemp(f"s3-{writer}")
            catalog = s3_layout(base)
            # an engine whose workers reach the store writes the version's prefix itself; others a local folder
            staging = catalog.new_staging("run1", "every_type", remote=engines[writer].writes_object_storage)
            assert isinstance(staging, ObjectPath) == (writer in ("spark", "dask", "ray"))
            written = engines[writer].write(engines[writer].read(source_of(base / "src", EXPECTED)), staging)
            published[writer] = catalog.publish("every_type", staging, kind="table", stage="s", run_id="run1",
                                                inputs={}, written=written,
                                                declared=dict(zip(EXPECTED.schema.names, EXPECTED.schema.types)))
        return published[writer]
    return publish


@pytest.mark.parametrize("writer", ENGINES)
@pytest.mark.parametrize("reader", ENGINES)
def test_every_type_survives_every_writer_reader_pair_through_object_storage(engines, published_to_s3, tmp_path,
                                                                            writer, reader):
    version = published_to_s3(writer)
    assert str(version.directory).startswith("contract/")  # an ObjectPath: no local file in between
    again = hand_off(engines[reader], version.source(), tmp_path / "read")
    assert_same(again, EXPECTED)


@pytest.mark.parametrize("writer, reader", PAIRS)
def test_odd_column_names_survive_every_writer_reader_pair(engines, written_by, tmp_path, writer, reader):
    """Dots, spaces, backticks, brackets, unicode and emoji are names, never expressions or paths."""
    written = written_by(writer, ODD_NAMES)
    assert_same(written, ODD_NAMES)
    again = hand_off(engines[reader], source_of(tmp_path / "mid", written), tmp_path / "read")
    assert_same(again, ODD_NAMES)


@pytest.mark.parametrize("name", ENGINES)
def test_empty_output_publishes_a_valid_dataset_with_its_schema_in_object_storage(engines, s3_layout, tmp_path,
                                                                                  name):
    """The same in a local workdir is each engine's own contract."""
    empty = EXPECTED.slice(0, 0)
    catalog = s3_layout(tmp_path)
    staging = catalog.new_staging("run1", "empty", remote=engines[name].writes_object_storage)
    engines[name].write(engines[name].read(source_of(tmp_path / "src", empty)), staging)
    version = catalog.publish("empty", staging, kind="table", stage="s", run_id="run1", inputs={})
    assert version.rows == 0
    table = read_arrow(version.source())
    assert table.num_rows == 0
    assert schema_differences(dict(zip(EXPECTED.schema.names, EXPECTED.schema.types)), table.schema) == []


@pytest.fixture(scope="module")
def published_by(engines, tmp_path_factory, request):
    """A table (PARTITIONED by week unless told) written by each engine and published (to a local
    workdir, or one in object storage), once per writer for the module (as written_by): the partition
    directories the writer made, and the published version."""
    published: dict[tuple[str, tuple[str, ...], str], tuple[list[str], object]] = {}

    def publish(writer: str, table: pa.Table = PARTITIONED, partition_by: tuple[str, ...] = ("week",),
                layout: str = "local"):
        key = writer, partition_by, layout
        if key not in published:
            base = tmp_path_factory.mktemp(f"partitioned-{writer}")
            catalog = Catalog(base / "home") if layout == "local" else request.getfixturevalue("s3_layout")(base)
            published[key] = publish_through(engines[writer], catalog, base, "weekly", table, partition_by)
        return published[key]
    return publish


@pytest.mark.parametrize("writer, reader, layout", [(writer, reader, "local") for writer, reader in PAIRS] +
                         [(writer, reader, "s3") for writer in ENGINES for reader in ENGINES])
def test_partitioned_dataset_keeps_the_partition_type_on_every_engine(engines, published_by, tmp_path, writer,
                                                                      reader, layout):
    directories, version = published_by(writer, layout=layout)
    assert directories == PARTITIONED_DIRECTORIES
    assert version.rows == 4 and version.manifest["schema"]["week"] == "date32[day]"
    back = hand_off(engines[reader], version.source(), tmp_path / "read")
    assert back.schema.field("week").type == pa.date32()
    assert_same(back.sort_by("customer"), PARTITIONED)


@pytest.mark.parametrize("writer, reader", PAIRS)
def test_odd_partition_names_and_values_survive_every_engine(engines, published_by, tmp_path, writer, reader):
    directories, version = published_by(writer, ODD_PARTITIONED, (ODD_PARTITION,))
    assert directories == ODD_PARTITION_DIRECTORIES  # one spelling whichever engine wrote it
    back = hand_off(engines[reader], version.source(), tmp_path / "read")
    assert_same(back.sort_by("row.id"), ODD_PARTITIONED)


@pytest.mark.parametrize("writer", ENGINES)
def test_odd_partition_values_are_spelled_the_same_in_object_storage(engines, published_by, tmp_path, writer):
    """Engines writing a version's prefix themselves (Ray renames what pyarrow percent-encodes: in
    object storage, by moving the files) leave the spelling every engine reads."""
    local, _ = published_by(writer, ODD_PARTITIONED, (ODD_PARTITION,))
    directories, version = published_by(writer, ODD_PARTITIONED, (ODD_PARTITION,), layout="s3")
    assert directories == local and isinstance(version.directory, ObjectPath)
    back = hand_off(engines["python"], version.source(), tmp_path / "read")
    assert_same(back.sort_by("row.id"), ODD_PARTITIONED)


STAGES = '''
import numpy as np
import pandas as pd


def make():
    return pd.DataFrame({"id": pd.array([1, 2, 3], dtype="int64[pyarrow]")})


def bad_value(x):
    raise ValueError(f"bad row {x}")  # the line every engine must point at


def double_python(numbers, ctx):
    assert type(numbers).__module__.startswith("pandas")
    (ctx.output_path("note") / "engine.txt").write_text("python")
    return numbers.assign(id=numbers["id"] * 2)


def double_spark(numbers, ctx):
    from pyspark.sql import DataFrame, functions as F
    assert isinstance(numbers, DataFrame) and ctx.spark is not None
    (ctx.output_path("note") / "engine.txt").write_text("spark")
    return numbers.select((F.col("id") * 2).alias("id"))


def double_dask(numbers, ctx):
    import dask.dataframe as dd
    assert isinstance(numbers, dd.DataFrame) and ctx.dask is not None
    assert numbers["id"].dtype == np.dtype("int64")  # numpy where it holds the values exactly
    (ctx.output_path("note") / "engine.txt").write_text("dask")
    return numbers.assign(id=numbers["id"] * 2)


def double_ray(numbers, ctx):
    assert isinstance(numbers, ctx.ray.data.Dataset)
    (ctx.output_path("note") / "engine.txt").write_text("ray")
    return numbers.map_batches(lambda b: b.assign(id=b["id"] * 2), batch_format="pandas")


def double_duckdb(numbers, ctx):
    import duckdb
    assert isinstance(numbers, duckdb.DuckDBPyRelation) and ctx.duckdb is not None
    (ctx.output_path("note") / "engine.txt").write_text("duckdb")
    return numbers.project("id * 2 AS id")


def double_polars(numbers, ctx):
    import polars as pl
    assert isinstance(numbers, pl.LazyFrame) and ctx.polars is pl
    (ctx.output_path("note") / "engine.txt").write_text("polars")
    return numbers.with_columns(pl.col("id") * 2)


def same(events):
    return events


def fail_python(numbers):
    return numbers.assign(id=numbers["id"].map(bad_value))


def fail_spark(numbers):
    from pyspark.sql import functions as F
    return numbers.select(F.udf(bad_value, "long")("id").alias("id"))


def fail_dask(numbers):
    return numbers.map_partitions(lambda part: part.assign(id=part["id"].map(bad_value)), meta=numbers._meta)


def fail_ray(numbers):
    return numbers.map_batches(lambda b: b.assign(id=b["id"].map(bad_value)), batch_format="pandas")


def fail_duckdb(numbers, ctx):
    import contextlib
    with contextlib.suppress(Exception):  # registered by an earlier run on the same engine
        ctx.duckdb.remove_function("bad_value")
    ctx.duckdb.create_function("bad_value", bad_value, ["BIGINT"], "BIGINT")
    return numbers.project("bad_value(id) AS id")


def fail_polars(numbers):
    import polars as pl
    return numbers.with_columns(pl.col("id").map_elements(bad_value, return_dtype=pl.Int64))
'''


def pipeline(project, stage: str, outputs: str) -> str:
    backend = stage.split("_")[1]
    return project.pipeline(f'''
    name: contract-{stage.replace("_", "-")}
    datasets:
      note: {{kind: files}}
    stages:
      make: {{run: "mypkg.steps:make", outputs: [numbers]}}
      {stage}: {{run: "mypkg.steps:{stage}", backend: {backend}, inputs: [numbers], outputs: {outputs}}}
    ''', f"{stage}.yaml")


@pytest.mark.parametrize("name", ENGINES)
def test_stage_gets_native_frames_and_returns_them(engines, shared_project, name):
    path = pipeline(shared_project, f"double_{name}", "[doubled, note]")
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "success", result.error
    catalog = Catalog(shared_project.home(f"contract-double-{name}"))
    assert sorted(read_arrow(catalog.current("doubled").source()).column("id").to_pylist()) == [2, 4, 6]
    assert (catalog.current("note").directory / "engine.txt").read_text() == name


@pytest.mark.parametrize("name", ENGINES)
def test_failure_inside_the_engine_is_the_users_own_error(engines, shared_project, name):
    path = pipeline(shared_project, f"fail_{name}", "[broken]")
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "failed" and result.error.exit_code == ExitCode.STAGE_FAILED
    error = result.stages[f"fail_{name}"].error
    marked = '    raise ValueError(f"bad row {x}")  # the line every engine must point at'
    line = STAGES.lstrip("\n").splitlines().index(marked)
    assert error.startswith("ValueError: bad row "), error
    if name != "duckdb":  # DuckDB keeps only the text of an exception raised in a Python UDF, no traceback
        assert f"mypkg/steps.py:{line + 1} in bad_value" in error, error
    assert "Py4J" not in error and "RayTaskError" not in error
    assert Catalog(shared_project.home(f"contract-fail-{name}")).current("broken") is None


@pytest.mark.parametrize("name", ENGINES)
def test_external_csv_is_checked_and_typed_by_name_on_every_engine(engines, shared_project, name):
    # columns in another order than the schema declares them: matched by name, never by position
    shared_project.write("raw/events.csv", "amount,id,ts\n2.50,1,2026-01-05T10:00:00Z\n,2,2026-01-06T11:00:00Z\n")
    path = shared_project.pipeline(f'''
    name: external-{name}
    root: .
    datasets:
      events:
        path: raw/events.csv
        format: csv
        schema: {{id: int64, amount: "decimal(10,2)", ts: "timestamp[us, tz=UTC]"}}
    stages:
      copy: {{run: "mypkg.steps:same", backend: {name}, inputs: [events], outputs: [copied]}}
    ''', f"external-{name}.yaml")
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "success", result.error
    table = read_arrow(Catalog(shared_project.home(f"external-{name}")).current("copied").source())
    assert table.schema.field("amount").type == pa.decimal128(10, 2)
    assert table.schema.field("ts").type == pa.timestamp("us", "UTC")
    assert sorted(zip(table.column("id").to_pylist(), table.column("amount").to_pylist()),
                  key=lambda r: r[0]) == [(1, Decimal("2.50")), (2, None)]


def external_pipeline(project, name: str, engine: str, dataset: str) -> str:
    return project.pipeline(f'''
    name: {name}-{engine}
    root: .
    datasets:
{dataset}
    stages:
      copy: {{run: "mypkg.steps:same", backend: {engine}, inputs: [events], outputs: [copied]}}
    ''', f"{name}-{engine}.yaml")


def copied(project, name: str) -> pa.Table:
    return read_arrow(Catalog(project.home(name)).current("copied").source())


@pytest.mark.parametrize("name", ENGINES)
def test_external_csv_files_with_their_own_column_order_are_read_by_the_engine(engines, shared_project, name):
    # a folder of deliveries whose writers ordered the columns differently; the engine parses the
    # files itself (nothing staged by hybridflow's process) and matches every file by name
    shared_project.write("raw/orders/a.csv", "id,amount\n1,2.50\n2,\n")
    shared_project.write("raw/orders/b.csv", "amount,id\n7.25,3\n")
    shared_project.write("raw/orders/_SUCCESS", "")
    path = external_pipeline(shared_project, "orders", name, '''
      events: {path: raw/orders, format: csv, schema: {id: int64, amount: "decimal(10,2)"}}''')
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "success", result.error
    assert not list((shared_project.home(f"orders-{name}") / "staging").rglob("input-*"))
    table = copied(shared_project, f"orders-{name}")
    assert table.schema == pa.schema([("id", pa.int64()), ("amount", pa.decimal128(10, 2))])
    assert sorted(zip(table.column("id").to_pylist(), table.column("amount").to_pylist())) == [
        (1, Decimal("2.50")), (2, None), (3, Decimal("7.25"))]


@pytest.mark.parametrize("name", ENGINES)
def test_external_json_lines_are_typed_by_the_declared_schema(engines, shared_project, name):
    shared_project.write("raw/clicks.jsonl", '{"ts": "2026-01-05T10:00:00Z", "id": 1, "tag": "a"}\n'
                                             '{"id": 2, "ts": "2026-01-06T11:30:00Z", "tag": null}\n')
    path = external_pipeline(shared_project, "clicks", name, '''
      events: {path: raw/clicks.jsonl, format: json, schema: {id: int64, ts: "timestamp[us, tz=UTC]", tag: string}}''')
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "success", result.error
    table = copied(shared_project, f"clicks-{name}").sort_by("id")
    assert table.schema == pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", "UTC")), ("tag", pa.string())])
    assert table.column("ts").to_pylist() == [dt.datetime(2026, 1, 5, 10, tzinfo=dt.timezone.utc),
                                              dt.datetime(2026, 1, 6, 11, 30, tzinfo=dt.timezone.utc)]
    assert table.column("tag").to_pylist() == ["a", None]


@pytest.mark.parametrize("name", ENGINES)
def test_a_bad_value_deep_in_an_external_csv_names_the_file_on_every_engine(engines, shared_project, name):
    # far past the first block that hybridflow's process looks at: only the engine meets it
    rows = "".join(f"{i},{i}.5\n" for i in range(200_000))
    bad = shared_project.write(f"raw/deep-{name}/part-1.csv", f"id,amount\n{rows}oops,1.0\n")
    shared_project.write(f"raw/deep-{name}/part-0.csv", "id,amount\n1,1.0\n")
    path = external_pipeline(shared_project, "deep", name, f'''
      events: {{path: raw/deep-{name}, format: csv, schema: {{id: int64, amount: double}}}}''')
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "failed" and result.error.exit_code == ExitCode.DATA
    message = result.error.one_line()
    assert f"input 'events' cannot be read: {bad}" in message, message
    assert "oops" in message and "int64" in message, message
    assert Catalog(shared_project.home(f"deep-{name}")).current("copied") is None


@pytest.mark.parametrize("name", ENGINES)
def test_external_parquet_is_checked_against_its_schema_from_the_footers(engines, shared_project, name):
    data = shared_project.root / "raw" / f"typed-{name}"
    data.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int32()), "v": [0.5, 1.5]}), data / "a.parquet")
    path = external_pipeline(shared_project, "typed", name, f'''
      events: {{path: raw/typed-{name}, schema: {{v: double, id: int64}}}}''')
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "failed" and result.error.exit_code == ExitCode.DATA
    assert "column 'id': expected int64, got int32" in result.error.one_line()
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "v": [0.5, 1.5]}), data / "a.parquet")
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "success", result.error
    table = copied(shared_project, f"typed-{name}")
    assert table.schema.names == ["v", "id"]  # the declared order
    assert sorted(table.column("id").to_pylist()) == [1, 2]


def fragmented(directory, rows: int = 192_000, pieces: int = 24) -> TableSource:
    """A table spread over many small files, so each engine reads it as many tasks or blocks."""
    directory.mkdir(parents=True)
    ids = pa.array(range(rows), pa.int64())
    table = pa.table({"id": ids, "week": pa.array([dt.date(2026, 11, 2 + 7 * (i % 5)) for i in range(rows)]),
                      "score": pa.array([i * 0.37 % 101 for i in range(rows)]),
                      "tag": pa.array([f"customer-{i % 977}" for i in range(rows)])})
    step = rows // pieces
    for i in range(pieces):
        pq.write_table(table.slice(i * step, step), directory / f"part-{i:05d}.parquet")
    return TableSource("t", tuple(sorted(directory.glob("*.parquet"))), "parquet", table.schema)


@pytest.mark.parametrize("name", ENGINES)
def test_outputs_are_written_as_files_of_the_target_size_not_one_per_task(engines, tmp_path, name):
    source = fragmented(tmp_path / "src")
    total = sum(f.stat().st_size for f in source.files)
    engine = engines[name]
    whole = tmp_path / "whole"
    whole.mkdir()
    engine.write(engine.read(source), whole, (), target_file_size=10 * total)  # small: one file
    assert len(list(whole.rglob("*.parquet"))) == 1
    parted = tmp_path / "parted"
    parted.mkdir()
    engine.write(engine.read(source), parted, ("week",), target_file_size=10 * total)
    per_partition = [len(list(d.glob("*.parquet"))) for d in parted.iterdir() if d.is_dir()]
    assert per_partition == [1] * 5  # one file per partition, never one per task
    quarters = tmp_path / "quarters"
    quarters.mkdir()
    engine.write(engine.read(source), quarters, (), target_file_size=total // 4)
    files = list(quarters.rglob("*.parquet"))
    written = sum(f.stat().st_size for f in files)
    assert len(files) <= max(1, 2 * written // (total // 4)), [f.stat().st_size for f in files]
    if name != "spark":  # Spark never splits one task's output: this input is one task there
        assert len(files) >= 2
    assert pq.read_table([str(f) for f in files]).num_rows == 192_000


def with_unreadable_column(path, table: pa.Table, column: str) -> None:
    """Write `table` to `path`, then overwrite the data of `column` with bytes no reader can decode."""
    pq.write_table(table, path, compression="snappy")
    meta = pq.ParquetFile(path).metadata.row_group(0).column(table.schema.get_field_index(column))
    start = meta.dictionary_page_offset or meta.data_page_offset
    with open(path, "r+b") as handle:
        handle.seek(start)
        handle.write(b"\xff" * meta.total_compressed_size)


@pytest.mark.parametrize("name", ["dask", "ray"])
def test_a_stage_using_some_columns_reads_only_those_from_the_files(engines, tmp_path, name):
    """Column projection reaches the files: a column the stage does not use is never decoded (here
    it could not be), partition columns still come from the paths."""
    table = pa.table({"customer": pa.array(range(6), pa.int64()), "junk": pa.array([f"x{i}" * 50 for i in range(6)]),
                      "spend": pa.array([i * 1.5 for i in range(6)])})
    for week in ("2026-11-09", "2026-11-16"):
        (tmp_path / f"week={week}").mkdir()
        with_unreadable_column(tmp_path / f"week={week}" / "part-0.parquet", table, "junk")
    schema = pa.schema([("customer", pa.int64()), ("junk", pa.string()), ("spend", pa.float64()),
                        ("week", pa.date32())])
    source = TableSource("t", tuple(sorted(tmp_path.rglob("*.parquet"))), "parquet", schema, ("week",), tmp_path)
    frame = engines[name].read(source)
    if name == "ray":
        picked = pa.Table.from_pandas(frame.select_columns(["week", "spend"]).to_pandas(), preserve_index=False)
        with pytest.raises(DataError, match=r"input 't' cannot be read \(.*part-0\.parquet\)"):  # cannot be decoded
            frame.materialize()
    else:
        picked = pa.Table.from_pandas(frame[["week", "spend"]].compute(), preserve_index=False)
        with pytest.raises(DataError, match=r"input 't' cannot be read \(.*part-0\.parquet\)"):  # cannot be decoded
            frame.compute()
    rows = sorted(zip(picked.column("week").to_pylist(), picked.column("spend").to_pylist()))
    assert rows == sorted((dt.date.fromisoformat(week), i * 1.5) for week in ("2026-11-09", "2026-11-16")
                          for i in range(6))
