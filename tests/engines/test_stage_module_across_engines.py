"""A stage module is the user's own package: whatever engines ran or stopped before, every engine's
stage can use its module-level helpers, classes, closures and relative imports, including from
work the engine ships to its workers (Ray's map_batches and Tune trainables, Dask's map_partitions).

Regression: an embedded Dask cluster's scheduler (in hybridflow's process) imported the package from
an uploaded archive; once Dask stopped, a later Ray stage could not pickle a helper by reference."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hybridflow.data.tables import read_arrow
from hybridflow.store.catalog import Catalog

pytestmark = pytest.mark.timeout(600)

HELPERS = """
    def scale(values):
        return values * 2
"""

STAGES = """
    import pandas as pd
    import ray

    from .helpers import scale  # a relative import


    def helper(values):  # module-level helpers called from inside engine work
        return values + 1


    def _xy(frame):
        return float(frame["a"].sum())


    class Offset:  # a class of the module, instantiated inside Ray work
        def __init__(self, by):
            self.by = by

        def __call__(self, values):
            return values + self.by


    def make():
        return pd.DataFrame({"a": list(range(100)), "k": [i % 5 for i in range(100)]})


    def etl(made):
        return made


    def from_rdd(made):  # ordinary PySpark: a frame of rows made on the driver, whose size Spark cannot tell
        spark = made.sparkSession
        rows = spark.sparkContext.parallelize([(i, helper(i)) for i in range(10)])
        return spark.createDataFrame(rows, ["i", "j"])


    def _bump(part):
        return part.assign(b=helper(part["a"]))


    def features(rows):
        return rows.map_partitions(_bump)


    def _double(batch):
        batch["c"] = scale(helper(batch["a"])) + Offset(0)(0)
        return batch


    def score(features):
        return features.map_batches(_double, batch_format="pandas")


    def tune(dasked):
        from ray import tune as ray_tune

        frame = dasked.to_pandas()

        def trainable(config):  # a closure that calls a module-level helper
            return {"score": _xy(frame) * config["w"]}

        results = ray_tune.Tuner(trainable, param_space={"w": ray_tune.grid_search([1, 2])}).fit()
        return ray.data.from_pandas(pd.DataFrame({"score": sorted(r.metrics["score"] for r in results)}))


    def again(scored):
        return scored.map_partitions(_bump)


    def rescore(dasked):
        offset = Offset(1)
        return dasked.map_batches(lambda batch: batch.assign(d=offset(scale(batch["b"])), e=helper(batch["a"])),
                                  batch_format="pandas")
"""

PIPELINE = """
    name: modules
    root: .
    backends:
      spark: {master: "local[1]", conf: {spark.sql.shuffle.partitions: 2}}
      dask: {n_workers: 1, threads_per_worker: 1}
      ray: {num_cpus: 2}
    stages:
      make: {backend: python, run: "mypkg.steps:make", outputs: [made]}
      etl: {backend: spark, run: "mypkg.steps:etl", inputs: [made], outputs: [rows]}
      rdd: {backend: spark, run: "mypkg.steps:from_rdd", inputs: [made], outputs: [from_rdd]}
      features: {backend: dask, run: "mypkg.steps:features", inputs: [rows], outputs: [features]}
      score: {backend: ray, run: "mypkg.steps:score", inputs: [features], outputs: [scored]}
      again: {backend: dask, run: "mypkg.steps:again", inputs: [scored], outputs: [dasked]}
      tune: {backend: ray, run: "mypkg.steps:tune", inputs: [dasked], outputs: [tuned]}
      rescore: {backend: ray, run: "mypkg.steps:rescore", inputs: [dasked], outputs: [rescored]}
"""


def test_stage_module_helpers_work_from_ray_and_dask_work_after_every_other_engine(project):
    """python -> spark -> dask -> ray (map_batches), then dask between two Ray stages: a Dask stage
    after a Ray stage, and Ray stages after Dask ran and stopped (no later stage needs it), whose
    map_batches and Tune trainable call the module's helpers."""
    project.stages(STAGES)
    project.write("mypkg/helpers.py", HELPERS)
    pipeline = project.pipeline(PIPELINE)
    run = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", str(pipeline)], cwd=project.root,
                         capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, run.stdout + run.stderr
    catalog = Catalog(project.home("modules"))

    def frame(name):
        return read_arrow(catalog.current(name).source()).to_pandas().sort_values("a").reset_index(drop=True)

    a = frame("rescored")["a"]
    assert list(frame("features")["b"]) == list(range(1, 101))
    assert list(frame("scored")["c"]) == [2 * (v + 1) for v in range(100)]
    assert list(frame("rescored")["d"]) == [2 * (v + 1) + 1 for v in a]
    assert list(frame("rescored")["e"]) == [v + 1 for v in a]
    from_rdd = read_arrow(catalog.current("from_rdd").source()).to_pandas().sort_values("i")
    assert list(from_rdd["j"]) == [i + 1 for i in range(10)]
    tuned = read_arrow(catalog.current("tuned").source()).to_pandas()
    assert list(tuned["score"]) == [4950.0, 9900.0]
