"""A fifth engine, added the way a third-party package adds one: an `ENGINE` in its own module,
found through the `hybridflow.backends` entry point group. Nothing in hybridflow names it; the
registry, the pipeline file's model, validate, the planner and the runner take it as they take the
built-in four, and it passes the backend contract (every type survives a hand-off in both
directions with the python engine, an empty output keeps its schema, partitions keep their type)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from hybridflow import backends
from hybridflow.catalog import Catalog
from hybridflow.contract import schema_differences
from hybridflow.spec import pipeline_model
from hybridflow.tables import read_arrow
from tests.engines.test_backends import EXPECTED, PARTITIONED, assert_same, hand_off, source_of

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    """An installed distribution that declares the engine: its dist-info, on sys.path."""
    site = tmp_path_factory.mktemp("site")
    info = site / "hybridflow_arrow_tables-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hybridflow-arrow-tables\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hybridflow.backends]\narrow = tests.plugin.arrow_tables\n")
    sys.path.insert(0, str(site))
    backends.engines.cache_clear()
    pipeline_model.cache_clear()
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        backends.engines.cache_clear()
        pipeline_model.cache_clear()


@pytest.fixture(scope="module")
def arrow(plugin_site, tmp_path_factory):
    engine = backends.create("arrow", None, tmp_path_factory.mktemp("logs"))
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def python(tmp_path_factory):
    return backends.create("python", None, tmp_path_factory.mktemp("logs"))


def test_the_entry_point_registers_the_engine_beside_the_built_in_ones(plugin_site):
    assert list(backends.engines()) == [*backends.BUILT_IN, "arrow"]
    assert backends.engine("arrow").frame_types == "pyarrow.Table"
    assert "arrow" in pipeline_model().model_fields["backends"].annotation.model_fields


@pytest.mark.parametrize("writer, reader", [("arrow", "arrow"), ("arrow", "python"), ("python", "arrow")])
def test_every_type_survives_a_hand_off_through_the_plugin(arrow, python, tmp_path, writer, reader):
    engines = {"arrow": arrow, "python": python}
    written = hand_off(engines[writer], source_of(tmp_path / "src", EXPECTED), tmp_path / "written")
    assert_same(written, EXPECTED)
    again = hand_off(engines[reader], source_of(tmp_path / "mid", written), tmp_path / "read")
    assert_same(again, EXPECTED)


def test_an_empty_and_a_partitioned_output_keep_their_schema(arrow, tmp_path):
    catalog = Catalog(tmp_path / "home")
    staging = catalog.new_staging("run1", "empty")
    arrow.write(arrow.read(source_of(tmp_path / "src", EXPECTED.slice(0, 0))), staging)
    version = catalog.publish("empty", staging, kind="table", stage="s", run_id="run1", inputs={})
    assert version.rows == 0
    assert schema_differences(dict(zip(EXPECTED.schema.names, EXPECTED.schema.types)),
                              read_arrow(version.source()).schema) == []
    staging = catalog.new_staging("run1", "parts")
    written = arrow.write(arrow.read(source_of(tmp_path / "parts", PARTITIONED)), staging, ("week",))
    version = catalog.publish("parts", staging, kind="table", stage="s", run_id="run1", inputs={},
                              partition_by=("week",), written=written)
    assert version.manifest["schema"]["week"] == "date32[day]"
    back = hand_off(arrow, version.source(), tmp_path / "read")
    assert back.schema.field("week").type == pa.date32()
    assert_same(back.sort_by("customer"), PARTITIONED)


STAGES = '''
import pyarrow as pa
import pyarrow.compute as pc


def make():
    return pa.table({"x": pa.array([1, 2, 3], pa.int64())})


def double(made):
    assert isinstance(made, pa.Table), type(made)
    return made.set_column(0, "x", pc.multiply(made["x"], 2))


def wrong(made):
    return made.to_pandas()
'''


def test_a_pipeline_runs_stages_on_the_plugin_from_the_cli(plugin_site, project):
    project.stages(STAGES)
    project.pipeline('''
    name: plugged
    backends:
      arrow: {threads: 2}
    stages:
      make: {run: "mypkg.steps:make", backend: arrow, outputs: [made]}
      double: {run: "mypkg.steps:double", backend: arrow, inputs: [made], outputs: [doubled]}
      wrong: {run: "mypkg.steps:wrong", backend: arrow, inputs: [made], outputs: [bad]}
    ''')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_site), str(ROOT), os.environ.get("PYTHONPATH", "")])}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], cwd=project.root, env=env,
                              capture_output=True, text=True, timeout=120)

    assert cli("validate", "pipeline.yaml").returncode == 0
    ran = cli("run", "pipeline.yaml", "--keep-going")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    wrong = "stage 'wrong' returned a pandas DataFrame for output 'bad'; the arrow backend writes pyarrow.Table"
    assert wrong in ran.stderr
    doubled = read_arrow(Catalog(project.home("plugged")).current("doubled").source())
    assert doubled["x"].to_pylist() == [2, 4, 6]
    project.pipeline((project.root / "pipeline.yaml").read_text().replace("threads: 2", "thread: 2"))
    bad = cli("validate", "pipeline.yaml")
    assert bad.returncode == 78 and "unknown key 'thread' in backends.arrow (did you mean 'threads'?)" in bad.stdout
