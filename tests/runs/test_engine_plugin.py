"""A seventh engine, added the way a third-party package adds one: an `ENGINE` in its own module,
found through the `hybridflow.backends` entry point group. Nothing in hybridflow names it; the
registry, the pipeline file's model, validate, the planner and the runner take it as they take the
built-in six, and it passes the backend contract as a third-party package would run it: a subclass of
hybridflow.testing.BackendContract (every type and odd names survive a hand-off in both directions
with the python engine and with itself, an empty output keeps its schema, partitions keep their type
and odd partition names and values survive), the entry point registered before the engine starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow import backends
from hybridflow.data.tables import read_arrow
from hybridflow.definition.model import pipeline_model
from hybridflow.store.catalog import Catalog
from hybridflow.testing import BackendContract

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
    backends.engines.cache_clear()  # the registry looks again (the pipeline file's model follows it)
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        backends.engines.cache_clear()


def test_the_entry_point_registers_the_engine_beside_the_built_in_ones(plugin_site):
    assert list(backends.engines()) == [*backends.BUILT_IN, "arrow"]
    assert backends.engine("arrow").frame_types == "pyarrow.Table"
    assert "arrow" in pipeline_model().model_fields["backends"].annotation.model_fields


class TestArrowContract(BackendContract):
    engine = "arrow"  # tests/plugin/arrow_tables.py, through its entry point

    @pytest.fixture(scope="class")
    @classmethod
    def engine_setup(cls, plugin_site):
        """The entry point is on sys.path before the engine is created."""
        yield


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
