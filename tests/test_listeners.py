"""Every embedded engine listens on 127.0.0.1 only, with no dashboard or job API port open, while a
stage of each engine runs (sampled from the run's whole process tree)."""

from __future__ import annotations

import sys

import pytest

from .conftest import Project
from .listeners import run_sampled

pytestmark = pytest.mark.timeout(900)

STAGES = '''
import time

import pandas as pd


def make():
    time.sleep(2)
    return pd.DataFrame({"id": range(100)})


def on_spark(numbers):
    time.sleep(2)
    return numbers.filter("id % 2 = 0")


def on_dask(evens):
    time.sleep(2)
    return evens[evens["id"] % 3 == 0]


def on_ray(sixes):
    time.sleep(2)
    return sixes.map_batches(lambda b: b.assign(id=b["id"] * 2), batch_format="pandas")
'''


def test_a_stage_per_engine_listens_on_loopback_only(tmp_path):
    project = Project(tmp_path)
    project.stages(STAGES)
    path = project.pipeline('''
    name: listeners
    stages:
      make: {run: "mypkg.steps:make", outputs: [numbers]}
      spark: {run: "mypkg.steps:on_spark", backend: spark, inputs: [numbers], outputs: [evens]}
      dask: {run: "mypkg.steps:on_dask", backend: dask, inputs: [evens], outputs: [sixes]}
      ray: {run: "mypkg.steps:on_ray", backend: ray, inputs: [sixes], outputs: [doubled]}
    ''')
    done, listeners = run_sampled([sys.executable, "-m", "hybridflow.cli", "run", str(path)], timeout=600,
                                  cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    names = " ".join(n for found in listeners.seen.values() for n in found)
    assert "java" in names and "ray" in names, listeners.seen  # the engines' own processes were sampled
    assert listeners.problems() == []
