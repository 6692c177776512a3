"""Inputs a user's own tools wrote, read by every engine: bad files give one data error naming the
file (exit 65) before the stage runs, whichever engine reads them; physical type variants and very
wide tables pass; a re-run stage that writes the same rows lets the next stage skip."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.data.tables import read_arrow
from hybridflow.definition.config import load_pipeline
from hybridflow.errors import DataError, ExitCode
from hybridflow.execution import planning
from hybridflow.execution.planner import SKIP
from hybridflow.execution.runner import Runner
from hybridflow.results import RunOptions
from hybridflow.store.catalog import Catalog
from tests.support.engines import ENGINES, engines_for_module
from tests.support.projects import Project

STAGES = '''
def same(events):
    return events


def make_python(events):
    return events.sort_values("id").reset_index(drop=True)


def make_spark(events):
    return events.orderBy("id").coalesce(1)


def make_dask(events):
    return events.repartition(npartitions=1)


def make_ray(events):
    return events.repartition(1)


def make_duckdb(events):
    return events.order("id")


def make_polars(events):
    return events.sort("id")


def counted_python(events):
    return events


def counted_spark(events):  # the engine reads in the stage's own code, not at the write
    events.count()
    return events


def counted_dask(events):
    len(events)
    return events


def counted_ray(events):
    return events.materialize()


def counted_duckdb(events):
    events.fetchall()
    return events


def counted_polars(events):
    return events.collect()


def total(made):
    import pandas as pd
    return pd.DataFrame({"total": [int(made["id"].sum())]})
'''


@pytest.fixture(scope="module")
def shared_project(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("bad-inputs"))
    project.stages(STAGES)
    return project


@pytest.fixture(scope="module")
def engines(tmp_path_factory, shared_project):
    yield from engines_for_module(tmp_path_factory, shared_project)


def copy_pipeline(project: Project, name: str, backend: str, path: str, function: str = "same") -> str:
    return project.pipeline(f'''
    name: {name}
    root: .
    datasets:
      events: {{path: {path}}}
    stages:
      copy: {{run: "mypkg.steps:{function}", backend: {backend}, inputs: [events], outputs: [copied]}}
    ''', f"{name}.yaml")


def good_table(rows: int = 1000) -> pa.Table:
    return pa.table({"id": np.arange(rows), "v": np.arange(rows) * 0.5, "name": [f"n{i}" for i in range(rows)]})


def write_bad_input(kind: str, directory) -> str:
    """An external input directory holding one bad file of `kind`; returns what the error must name."""
    directory.mkdir(parents=True)
    pq.write_table(good_table(), directory / "a.parquet", compression="snappy")
    bad = directory / "b.parquet"
    if kind == "random bytes":
        bad.write_bytes(np.random.default_rng(1).bytes(5000))
        return "b.parquet is not a Parquet file"
    if kind == "truncated":
        pq.write_table(good_table(), bad)
        bad.write_bytes(bad.read_bytes()[:3000])
        return "b.parquet is truncated"
    if kind == "text":
        bad.write_text("id,v\n1,2\n")
        return "b.parquet is not a Parquet file"
    if kind == "mixed schema":
        pq.write_table(pa.table({"id": [1], "v": ["text"], "name": ["x"]}), bad)
        return "b.parquet has column 'v' as string where a.parquet has double"
    if kind == "missing column":
        pq.write_table(pa.table({"id": [1], "name": ["x"]}), bad)
        return "b.parquet has no column 'v'"
    raise AssertionError(kind)


BAD = ("random bytes", "truncated", "text", "mixed schema", "missing column")


@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.parametrize("kind", BAD)
def test_a_bad_file_is_one_data_error_naming_it_on_every_engine(engines, shared_project, tmp_path, name, kind):
    expected = write_bad_input(kind, tmp_path / "events")
    path = copy_pipeline(shared_project, f"bad-{name}-{kind.replace(' ', '-')}", name, str(tmp_path / "events"))
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "failed"
    assert result.error.exit_code == ExitCode.DATA, result.error
    assert expected in result.error.message, result.error.message
    assert "\n" not in result.error.message
    assert "Py4J" not in result.error.message and "KeyError" not in result.error.message


def corrupt_first_page(file) -> None:
    """Garbage where the first column chunk's page header starts: the footer still reads, the data
    does not decode (pyarrow: OSError "Couldn't deserialize thrift")."""
    data = bytearray(file.read_bytes())
    data[4:40] = b"\xff" * 36
    file.write_bytes(bytes(data))


def corrupt_dictionary_indices(file) -> None:
    """Rewrite `file` uncompressed with a 3-value dictionary column whose last data page bytes point
    past the dictionary's end: the page header decodes, its values do not (pyarrow: ArrowInvalid
    "Index not in dictionary bounds"; Spark: an ArrayIndexOutOfBoundsException naming no file)."""
    table = good_table().set_column(2, "name", pa.array([f"n{i % 3}" for i in range(1000)]))
    pq.write_table(table, file, compression="none")
    chunk = pq.read_metadata(file).row_group(0).column(2)
    end = (chunk.dictionary_page_offset or chunk.data_page_offset) + chunk.total_compressed_size
    data = bytearray(file.read_bytes())
    data[end - 16:end] = b"\xff" * 16
    file.write_bytes(bytes(data))


DAMAGE = {"page header": corrupt_first_page, "dictionary index": corrupt_dictionary_indices}


@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("read", ["at the write", "in the stage"])
def test_a_corrupt_page_found_while_reading_is_one_data_error_naming_the_file(engines, shared_project, tmp_path,
                                                                             name, damage, read):
    (tmp_path / "events").mkdir()
    pq.write_table(good_table(), tmp_path / "events" / "a.parquet")
    file = tmp_path / "events" / "b.parquet"  # a good file beside it: the error must say which one
    pq.write_table(good_table(), file)
    DAMAGE[damage](file)
    pq.read_metadata(file)  # the footer is intact: only reading the data finds the damage
    pipeline = f"corrupt-{damage}-{read}-{name}".replace(" ", "-")
    function = "same" if read == "at the write" else f"counted_{name}"
    path = copy_pipeline(shared_project, pipeline, name, str(tmp_path / "events"), function)
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "failed"
    assert result.error.exit_code == ExitCode.DATA, result.error
    assert type(result.error) is DataError, repr(result.error)  # hybridflow's own, not inside an engine's wrapper
    assert f"input 'events' cannot be read ({file}): " in result.error.message, result.error.message
    assert "\n" not in result.error.one_line()
    assert not any(raw in result.error.one_line() for raw in ("ArrowInvalid", "Py4J", "RayTaskError", "KeyError"))



def test_a_corrupt_page_is_still_told_apart_once_the_jvm_has_thrown_its_error_many_times(engines, shared_project,
                                                                                          tmp_path):
    """The JVM throws a hot exception bare (no message, no stack) unless told not to: the same
    corrupt page read again and again must still be one data error naming the file."""
    (tmp_path / "events").mkdir()
    file = tmp_path / "events" / "b.parquet"
    corrupt_dictionary_indices(file)
    session = engines["spark"].session
    for _ in range(12):  # warm the exception past the JVM's fast-throw threshold
        with pytest.raises(Exception, match="ArrayIndexOutOfBoundsException"):
            session.read.parquet(str(tmp_path / "events")).collect()
    path = copy_pipeline(shared_project, "corrupt-hot-exception", "spark", str(tmp_path / "events"), "counted_spark")
    result = Runner(load_pipeline(path), engines=engines).run()
    assert type(result.error) is DataError, repr(result.error)
    assert f"input 'events' cannot be read ({file}): " in result.error.message, result.error.message

@pytest.mark.parametrize("name", ENGINES)
def test_physical_type_variants_reach_every_engine_as_standard_types(engines, shared_project, tmp_path, name):
    (tmp_path / "events").mkdir()
    table = pa.table({
        "id": pa.array([1, 2, 3], pa.int64()),
        "s": pa.array(["a", None, "ccc"], pa.string_view()),
        "ls": pa.array(["x", "y", None], pa.large_string()),
        "lb": pa.array([b"\x00", None, b"z"], pa.large_binary()),
        "ll": pa.array([[1, 2], None, []], pa.large_list(pa.int32())),
    })
    pq.write_table(table, tmp_path / "events" / "a.parquet")
    path = copy_pipeline(shared_project, f"variants-{name}", name, str(tmp_path / "events"))
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "success", result.error
    copied = read_arrow(Catalog(shared_project.home(f"variants-{name}")).current("copied").source())
    copied = copied.sort_by([("id", "ascending")], null_placement="at_end")
    assert copied.schema.field("s").type == pa.string()
    assert copied.schema.field("ll").type == pa.list_(pa.int32())
    expected = table.cast(copied.schema)
    for column in table.column_names:
        assert copied.column(column).to_pylist() == expected.column(column).to_pylist(), column


@pytest.mark.parametrize("name", ENGINES)
def test_a_table_of_thousands_of_columns_passes_every_engine(engines, shared_project, tmp_path, name):
    (tmp_path / "events").mkdir()
    columns = 3000
    pq.write_table(pa.table({f"c{i}": np.arange(20) + i for i in range(columns)}), tmp_path / "events" / "w.parquet")
    path = copy_pipeline(shared_project, f"wide-{name}", name, str(tmp_path / "events"))
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "success", result.error
    copied = read_arrow(Catalog(shared_project.home(f"wide-{name}")).current("copied").source())
    assert copied.num_columns == columns and copied.num_rows == 20
    assert sorted(copied.column("c2999").to_pylist()) == list(range(2999, 3019))


@pytest.mark.parametrize("name", ENGINES)
def test_a_forced_stage_that_writes_the_same_rows_lets_the_next_stage_skip(engines, shared_project, tmp_path, name):
    (tmp_path / "events").mkdir()
    pq.write_table(good_table(200), tmp_path / "events" / "a.parquet")
    path = shared_project.pipeline(f'''
    name: rerun-{name}
    root: .
    datasets:
      events: {{path: {tmp_path / "events"}}}
    stages:
      make: {{run: "mypkg.steps:make_{name}", backend: {name}, inputs: [events], outputs: [made]}}
      total: {{run: "mypkg.steps:total", inputs: [made], outputs: [summary]}}
    ''', f"rerun-{name}.yaml")
    assert Runner(load_pipeline(path), engines=engines).run().status == "success"
    catalog = Catalog(shared_project.home(f"rerun-{name}"))
    first = catalog.current("made").id
    forced = Runner(load_pipeline(path), RunOptions(force={"make"}), engines=engines).run()
    assert forced.status == "success", forced.error
    assert catalog.current("made").id != first  # a new version was written...
    decisions = planning.plan(load_pipeline(path)).decisions
    assert decisions["total"].action == SKIP, decisions["total"].reason  # ...holding the same data
