"""hybridflow run --watch, as a user runs it: a save of a stage module re-runs that stage and those
downstream on the engine already running (its workers get the new code), a YAML that does not
load is reported and waited out, and Ctrl-C ends it with exit code 130 and no process left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hybridflow.reporting.timeline import ENGINE_START
from hybridflow.store.state import RunStore
from tests.support.engines import assert_nothing_left

pytestmark = pytest.mark.timeout(600)

STEPS = """
import pandas as pd


def scaled(part):  # runs on the engine's workers, which import it from this module
    return part.assign(y=part.x * 2)


def make(ctx):
    return pd.DataFrame({"x": range(10)})


def double(numbers):
    if hasattr(numbers, "mapInPandas"):  # Spark: scaled runs in its Python workers
        return numbers.mapInPandas(lambda batches: (scaled(b) for b in batches), "x long, y long")
    if hasattr(numbers, "map_partitions"):  # Dask: on its workers
        return numbers.map_partitions(scaled)
    return scaled(numbers)


def total(doubled):
    return pd.DataFrame({"s": [int(doubled.y.sum())]})
"""

PIPELINE = """
name: w
stages:
  make: {{run: mypkg.steps:make, outputs: [numbers]}}
  double: {{backend: {backend}, run: mypkg.steps:double, inputs: [numbers], outputs: [doubled]}}
  total: {{run: mypkg.steps:total, inputs: [doubled], outputs: [summed]}}
backends:
  dask: {{n_workers: 1, threads_per_worker: 1, processes: true}}
  spark: {{master: "local[1]", conf: {{spark.sql.shuffle.partitions: 1}}}}
"""


class Watching:
    """A `hybridflow run --watch` process; its output goes to a file, read as it grows."""

    def __init__(self, project, command: tuple[str, ...] = ("run", "--watch")) -> None:
        self.project = project
        self.marker = uuid.uuid4().hex
        self.output = project.root / "watch.out"
        env = {**os.environ, "HYBRIDFLOW_TEST_RUN": self.marker}
        with self.output.open("w") as sink:
            self.process = subprocess.Popen([sys.executable, "-m", "hybridflow.cli", *command, "pipeline.yaml"],
                                            cwd=project.root, env=env, stdout=sink, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.output.read_text()

    def wait_for(self, what: str, count: int, seconds: float = 240) -> None:
        """Until `what` has been printed `count` times."""
        deadline = time.monotonic() + seconds
        while self.text().count(what) < count:
            assert self.process.poll() is None, f"--watch ended before '{what}' x{count}:\n{self.text()}"
            assert time.monotonic() < deadline, f"no '{what}' x{count} after {seconds} s:\n{self.text()}"
            time.sleep(0.2)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout=120)
        finally:
            if self.process.poll() is None:
                self.process.kill()


def runs(project) -> list[dict]:
    """Run records, oldest first, each with its stages by name and its engine starts."""
    store = RunStore(project.root / ".hybridflow" / "runs.db")
    found = store.runs("w", limit=50)[::-1]
    for run in found:
        run["stages"] = {s["stage"]: s for s in store.stages(run["run_id"])}
        run["engine_starts"] = [s["detail"] for s in store.spans(run["run_id"]) if s["kind"] == ENGINE_START]
    return found


def saved(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def summed(project) -> int:
    import hybridflow

    return int(hybridflow.read(project.root / "pipeline.yaml", "summed")["s"][0])


@pytest.mark.parametrize("backend", ["dask", "spark"])
def test_a_saved_stage_module_reruns_it_and_downstream_on_the_warm_engine(project, backend):
    steps = project.stages(STEPS)
    project.pipeline(PIPELINE.format(backend=backend))
    watching = Watching(project)
    try:
        watching.wait_for("watching", 1)
        first = runs(project)[0]
        assert {s["status"] for s in first["stages"].values()} == {"done"}
        assert backend in first["engine_starts"]
        assert summed(project) == 90

        saved(steps, "part.x * 2", "part.x * 3")  # only the helper the Dask workers run changes
        watching.wait_for("watching", 2)
        second = runs(project)[1]
        assert {name: s["status"] for name, s in second["stages"].items()} == \
            {"make": "skipped", "double": "done", "total": "done"}
        assert second["engine_starts"] == [] and second["stages"]["double"]["engine_start"] is None
        assert summed(project) == 135  # the workers ran the new code, without a restart
        assert "restarting" not in watching.text()
    finally:
        code = watching.stop()
    assert code == 130, watching.text()
    assert_nothing_left(watching.marker, 60)


def test_a_yaml_that_does_not_load_is_reported_and_the_next_save_runs(project):
    project.stages(STEPS)
    yaml = project.pipeline(PIPELINE.format(backend="python"))
    watching = Watching(project)
    try:
        watching.wait_for("watching", 1)
        yaml.write_text(yaml.read_text() + "bad: [\n")
        watching.wait_for("watching", 2)
        assert "pipeline.yaml:" in watching.text() and "YAML syntax error" in watching.text()
        assert len(runs(project)) == 1  # nothing ran on a file that does not load
        yaml.write_text(yaml.read_text().replace("bad: [\n", "# fixed\n"))
        watching.wait_for("watching", 3)
        assert [r["status"] for r in runs(project)] == ["success", "success"]
        assert {s["status"] for s in runs(project)[1]["stages"].values()} == {"skipped"}
    finally:
        code = watching.stop()
    assert code == 130, watching.text()
    assert_nothing_left(watching.marker, 30)


def test_the_library_entry_point_runs_and_returns_the_last_result(project):
    import hybridflow

    project.stages(STEPS)
    project.pipeline(PIPELINE.format(backend="python"))
    result = hybridflow.watch(project.root / "pipeline.yaml", runs=1)
    assert result.status == "success" and summed(project) == 90


COUNTED = """
import pandas as pd


def count(events):
    return pd.DataFrame({"n": [len(events)], "total": [int(events.amount.sum())]})
"""

COUNTING = """
name: w
datasets:
  events: {path: incoming, format: csv, schema: {amount: int64}}
stages:
  count: {run: mypkg.steps:count, inputs: [events], outputs: [counted]}
"""


def test_dev_reruns_on_a_change_to_an_external_input_and_a_file_added_to_it(project):
    import hybridflow

    project.stages(COUNTED)
    project.pipeline(COUNTING)
    project.write("incoming/a.csv", "amount\n1\n2\n")
    watching = Watching(project, command=("dev",))
    counted = lambda: hybridflow.read(project.root / "pipeline.yaml", "counted").to_dict("records")  # noqa: E731
    try:
        watching.wait_for("watching", 1)
        assert counted() == [{"n": 2, "total": 3}]
        project.write("incoming/a.csv", "amount\n1\n2\n30\n")  # a saved input
        watching.wait_for("watching", 2)
        assert counted() == [{"n": 3, "total": 33}]
        project.write("incoming/b.csv", "amount\n100\n")  # a new file in the input directory
        watching.wait_for("watching", 3)
        assert counted() == [{"n": 4, "total": 133}]
        assert [r["status"] for r in runs(project)] == ["success"] * 3
        assert "changed: " in watching.text() and "b.csv" in watching.text()
    finally:
        code = watching.stop()
    assert code == 130, watching.text()
    assert_nothing_left(watching.marker, 30)


def test_the_library_entry_point_stays_callable_after_its_module_is_imported(project):
    """hybridflow.watch is the function, whatever was imported before (a submodule of that name
    would replace the package's attribute on import: a second call in a notebook failed)."""
    import hybridflow
    import hybridflow.execution.watching  # noqa: F401 - what the first call imports

    project.stages(STEPS)
    project.pipeline(PIPELINE.format(backend="python"))
    for _ in range(2):
        assert hybridflow.watch(project.root / "pipeline.yaml", runs=1).status == "success"
