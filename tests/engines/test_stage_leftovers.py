"""What a stage starts on hybridflow's side and leaves running (a plain subprocess, a daemon it
detaches with setsid) ends when its stage ends, on every engine's driver side, and nothing of it
outlives the run."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from hybridflow.data.tables import read_arrow
from hybridflow.store.catalog import Catalog
from tests.support.engines import assert_nothing_left

pytestmark = pytest.mark.timeout(600)

STAGES = """
    import os
    import subprocess
    from pathlib import Path

    import pandas as pd

    MARK = os.environ["LEFTOVER_MARK"]


    def _leave_processes(stage):
        env = {**os.environ, "LEFTOVER": f"{MARK}-{stage}"}
        subprocess.Popen(["sleep", "1000"], env=env)  # a child, never waited for
        subprocess.run(["setsid", "-f", "sleep", "1000"], env=env, check=True)  # a daemon, detached


    def _alive(stage):
        tag = f"LEFTOVER={MARK}-{stage}".encode()
        alive = 0
        for entry in Path("/proc").iterdir():
            try:
                alive += entry.name.isdigit() and tag in (entry / "environ").read_bytes()
            except OSError:
                pass
        return alive


    def make():
        _leave_processes("make")
        return pd.DataFrame({"a": [1, 2, 3]})


    def passed_on(stage, **inputs):
        _leave_processes(stage)
        [frame] = inputs.values()
        return frame


    def count(stage, **inputs):  # python: how many of the previous stage's processes are still there
        return pd.DataFrame({"stage": [stage], "alive": [_alive(stage)]})
"""

ENGINES = {"python": "", "timeout": ", timeout: 60", "spark": "", "dask": "", "ray": "", "duckdb": "", "polars": ""}


def pipeline() -> str:
    stages = ['make: {backend: python, run: "mypkg.steps:make", outputs: [made]}',
              'count_make: {backend: python, run: "mypkg.steps:count", inputs: [made], outputs: [alive_make], '
              'params: {stage: make}}']
    for name, extra in ENGINES.items():
        backend = "python" if name == "timeout" else name
        stages += [f'{name}: {{backend: {backend}, run: "mypkg.steps:passed_on", inputs: [made], '
                   f'outputs: [by_{name}], params: {{stage: {name}}}{extra}}}',
                   f'count_{name}: {{backend: python, run: "mypkg.steps:count", inputs: [by_{name}], '
                   f'outputs: [alive_{name}], params: {{stage: {name}}}}}']
    return ("name: leftovers\nroot: .\nbackends:\n  spark: {master: \"local[1]\"}\n"
            "  dask: {n_workers: 1, threads_per_worker: 1}\n  ray: {num_cpus: 1}\nstages:\n"
            + "".join(f"  {line}\n" for line in stages))


def test_processes_a_stage_leaves_end_with_the_stage_on_every_engine_and_none_outlive_the_run(project):
    mark = uuid.uuid4().hex
    project.stages(STAGES)
    project.write("pipeline.yaml", pipeline())
    run = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml"], cwd=project.root,
                         env={**os.environ, "LEFTOVER_MARK": mark},
                         capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, run.stdout + run.stderr
    catalog = Catalog(project.home("leftovers"))
    alive = {}
    for stage in ["make", *ENGINES]:
        frame = read_arrow(catalog.current(f"alive_{stage}").source()).to_pandas()
        alive[stage] = int(frame["alive"][0])
    assert alive == {stage: 0 for stage in alive}  # each stage's processes were gone when the next began
    assert_nothing_left(f"LEFTOVER={mark}", seconds=10)
