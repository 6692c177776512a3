"""The real engines, each printing a value from ${env:...} in its workers and raising it in an error,
with Spark's event log turned on and the value in Spark's conf: afterwards no file the run or its
engines wrote holds it in clear (the workdir, the event log directory, the engines' temporary
directories), and the terminal output redacts it too. Engine chatter (Ray's raylet warnings) goes to
engines.log, never the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SECRET = "pl4nted-s3cret-93ac"

STAGES = '''
import pandas as pd


def spark_prints(ctx, token):
    from pyspark.sql.functions import udf

    def shout(x):
        print("spark udf sees", token, flush=True)
        return x

    endpoint = ctx.spark.conf.get("spark.myapp.endpoint")  # conf holding a secret still reaches Spark
    if endpoint != "https://user:" + token + "@example.invalid":
        raise RuntimeError("spark.myapp.endpoint did not arrive")
    frame = ctx.spark.range(3).withColumn("id", udf(shout, "long")("id"))
    ctx.spark.sql(f"SELECT '{token}' AS t").collect()  # a plan that quotes it
    return frame


def spark_raises(ctx, token):
    from pyspark.sql.functions import udf

    def fail(x):
        raise RuntimeError("spark udf failed with " + token)

    return ctx.spark.range(3).withColumn("id", udf(fail, "long")("id"))


def dask_prints(printed, token):
    def show(part):
        print("dask task sees", token, flush=True)
        if len(part) and part["id"].iloc[0] == 0:
            raise RuntimeError("dask task failed with " + token)
        return part

    return printed.map_partitions(show, meta=printed._meta)


def ray_prints(ctx, printed, token):
    @ctx.ray.remote(num_cpus=0)
    class Probe:  # a worker process each: far past what Ray expects, so its raylet warns
        def ping(self):
            return 1

    probes = [Probe.remote() for _ in range(12)]
    ctx.ray.get([p.ping.remote() for p in probes])

    @ctx.ray.remote
    def show():
        print("ray task sees", token, flush=True)
        raise RuntimeError("ray task failed with " + token)

    ctx.ray.get(show.remote())
    return printed
'''


def files_holding(root: Path, value: bytes, since: float) -> list[str]:
    found = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and path.stat().st_mtime >= since \
                    and value in path.read_bytes():
                found.append(str(path))
        except OSError:
            continue
    return found


@pytest.mark.timeout(600)
def test_no_engine_file_or_output_holds_a_secret_in_clear(project, tmp_path, monkeypatch):
    events = tmp_path / "spark-events"
    events.mkdir()
    project.stages(STAGES)
    project.pipeline(f'''
    name: leaky
    params: {{token: "${{env:HF_TEST_SECRET}}"}}
    backends:
      spark:
        master: "local[1]"
        conf:
          spark.eventLog.enabled: "true"
          spark.eventLog.dir: "{events}"
          spark.eventLog.compress: "false"  # readable, so that the grep below can find a leak
          spark.myapp.endpoint: "https://user:${{env:HF_TEST_SECRET}}@example.invalid"
      ray: {{num_cpus: 1}}
      dask: {{n_workers: 1, threads_per_worker: 1}}
    stages:
      sp: {{run: "mypkg.steps:spark_prints", backend: spark, outputs: [printed]}}
      sr: {{run: "mypkg.steps:spark_raises", backend: spark, outputs: [raised]}}
      dk: {{run: "mypkg.steps:dask_prints", backend: dask, inputs: [printed], outputs: [dasked]}}
      ry: {{run: "mypkg.steps:ray_prints", backend: ray, inputs: [printed], outputs: [rayed]}}
    ''')
    since = time.time() - 1
    env = {**os.environ, "HF_TEST_SECRET": SECRET}
    result = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml", "--keep-going"],
                            cwd=project.root, env=env, capture_output=True, text=True, timeout=540)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output  # the raising stages failed, the printing one succeeded
    assert SECRET not in output
    assert "spark udf failed with ***" in output or "failed with ***" in output, output
    assert list(events.iterdir()), "Spark wrote no event log: the test would prove nothing"
    [engines_log] = project.home("leaky").glob("runs/*/logs/engines.log")
    assert "PYTHON worker processes have been started" in engines_log.read_text()
    assert "raylet" not in output
    leaks = files_holding(project.root, SECRET.encode(), since) + files_holding(events, SECRET.encode(), since)
    for temporary in {Path("/tmp"), Path(os.environ.get("TMPDIR", "/tmp"))}:
        for entry in temporary.iterdir():  # the engines' scratch: /tmp/spark-*, Ray's, Dask's
            if not entry.name.startswith("pytest-of-") and entry.is_dir() and not entry.is_symlink():
                leaks += files_holding(entry, SECRET.encode(), since)
    assert not leaks, f"the secret is in clear in: {leaks}"
