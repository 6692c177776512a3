"""Attaching to clusters someone else runs: a Spark standalone master and worker, a Dask scheduler
and worker, a Ray head, each started here on 127.0.0.1 from the installed packages. A pipeline runs
on each, its result is checked, and the cluster is still running afterwards: hybridflow never stops
a cluster it did not start. The tests stop them by process id."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from hybridflow.data.tables import read_arrow
from hybridflow.store.catalog import Catalog

BIN = Path(sys.executable).parent
# Cluster ports stay outside Ray's worker port range (10002-19999).
SPARK_PORT, SPARK_UI, SPARK_WORKER_UI = 7177, 8180, 8181
DASK_PORT = 8799
RAY_PORT = 6399

STAGES = '''
import pandas as pd


def make():
    return pd.DataFrame({"id": pd.array(range(10), dtype="int64[pyarrow]")})


def square(x):
    return x * x


def spark_square(numbers):
    from pyspark.sql import functions as F
    return numbers.select("id", F.udf(square, "long")("id").alias("squared"))  # runs on the worker


def dask_square(numbers):
    return numbers.map_partitions(lambda p: p.assign(squared=p["id"].map(square)),
                                  meta=numbers._meta.assign(squared=numbers._meta["id"]))


def ray_square(numbers):
    return numbers.map_batches(lambda b: b.assign(squared=b["id"].map(square)), batch_format="pandas")
'''


def wait_for(check, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come up within {timeout} s")
        time.sleep(0.5)


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def launch(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(args, env={**os.environ, **env}, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(processes: list[subprocess.Popen]) -> None:
    """SIGTERM, then SIGKILL to what is left after 3 s: Spark's and Dask's daemons end within half a
    second, and `ray start --block` often not within 30 (it was killed at that deadline anyway)."""
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(3)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def run_attached(project, backend: str, settings: str, env: dict | None = None) -> list:
    """Run the pipeline from the CLI in its own process, as a user would, attached to the cluster."""
    project.stages(STAGES)
    path = project.pipeline(f'''
    name: attached-{backend}
    backends:
      {backend}: {settings}
    stages:
      make: {{run: "mypkg.steps:make", outputs: [numbers]}}
      square: {{run: "mypkg.steps:{backend}_square", backend: {backend}, inputs: [numbers], outputs: [squares]}}
    ''')
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", str(path)], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    table = read_arrow(Catalog(project.home(f"attached-{backend}")).current("squares").source())
    return sorted(zip(table.column("id").to_pylist(), table.column("squared").to_pylist()))


SQUARES = [(i, i * i) for i in range(10)]


def test_spark_standalone_cluster(project, tmp_path):
    import pyspark

    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    env = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(tmp_path)}
    master = launch([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(SPARK_PORT), "--webui-port", str(SPARK_UI)], env, tmp_path / "master.log")
    worker = None
    try:
        wait_for(lambda: port_open(SPARK_PORT), "the spark master")
        worker = launch([spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{SPARK_PORT}",
                         "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                         "--webui-port", str(SPARK_WORKER_UI), "--work-dir", str(tmp_path / "work")],
                        env, tmp_path / "worker.log")

        def workers_alive() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{SPARK_UI}/json/", timeout=2) as answer:
                    return json.load(answer).get("aliveworkers", 0) >= 1
            except OSError:
                return False

        wait_for(workers_alive, "the spark worker")
        conf = '{master: "spark://127.0.0.1:%d", conf: {spark.executor.memory: 512m, spark.cores.max: 1}}' % SPARK_PORT
        # executors run the Python the driver names (PYSPARK_PYTHON): this venv's, not python3 on PATH
        assert run_attached(project, "spark", conf, {"PYSPARK_PYTHON": sys.executable}) == SQUARES
        assert master.poll() is None and worker.poll() is None  # still running: not ours to stop
    finally:
        stop([p for p in (worker, master) if p])


def test_dask_scheduler_and_worker(project, tmp_path):
    scheduler = launch([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(DASK_PORT),
                        "--no-dashboard"], {}, tmp_path / "scheduler.log")
    worker = None
    try:
        wait_for(lambda: port_open(DASK_PORT), "the dask scheduler")
        worker = launch([str(BIN / "dask"), "worker", f"tcp://127.0.0.1:{DASK_PORT}", "--host", "127.0.0.1",
                         "--nworkers", "1", "--nthreads", "1", "--no-dashboard"], {}, tmp_path / "worker.log")
        from distributed import Client

        def worker_joined() -> bool:
            with Client(f"tcp://127.0.0.1:{DASK_PORT}", timeout=5) as client:
                return len(client.scheduler_info(n_workers=-1)["workers"]) >= 1

        wait_for(worker_joined, "the dask worker")
        assert run_attached(project, "dask", f'{{address: "tcp://127.0.0.1:{DASK_PORT}"}}') == SQUARES
        assert scheduler.poll() is None and worker.poll() is None
    finally:
        stop([p for p in (worker, scheduler) if p])


def test_ray_head(project, tmp_path):
    temp_dir = tempfile.mkdtemp(prefix="hf-ray-")  # short: Ray's socket paths must fit in 107 bytes
    token = "hybridflow-test-token-0123456789"
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    log = tmp_path / "head.log"
    head = launch([str(BIN / "ray"), "start", "--head", "--block", "--port", str(RAY_PORT),
                   "--node-ip-address", "127.0.0.1", "--include-dashboard=false", "--num-cpus", "2",
                   "--temp-dir", temp_dir], {**env, "PYTHONUNBUFFERED": "1"}, log)
    try:
        # `ray start` prints this once its raylet is up (the GCS port opens earlier); unbuffered, as it happens
        wait_for(lambda: head.poll() is not None or "Ray runtime started." in log.read_text(errors="replace"),
                 "the ray head")
        assert head.poll() is None, f"ray start --head exited with {head.returncode}: {log.read_text()}"
        # the driver needs the cluster's token, like any client of a token-protected Ray cluster
        assert run_attached(project, "ray", f'{{address: "127.0.0.1:{RAY_PORT}"}}', env) == SQUARES
        assert head.poll() is None
    finally:
        stop([head])
        shutil.rmtree(temp_dir, ignore_errors=True)
