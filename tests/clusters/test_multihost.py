"""The same YAML on clusters whose nodes are other hosts. Two network namespaces stand for two remote
hosts, "head" (10.213.0.2: a Spark master, a Dask scheduler, a Ray head with token auth) and "node"
(10.213.0.3: a Spark worker, a Dask worker, a Ray worker node); hybridflow runs in the root namespace
(10.213.0.1), attached to all three, and must give what the embedded engines give, with every listener
on 127.0.0.1 or an address of those hosts. The hosts share this machine's filesystem, so a workdir under
tmp_path is shared; a worker in a mount namespace where it is hidden must be refused (exit 69). (With
the workdir in S3 and no shared filesystem: tests/clusters/test_ssh_clusters.py.) Engine processes are stopped
by process id and the namespaces deleted, pass or fail. Needs root."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from hybridflow.data.tables import read_arrow
from hybridflow.errors import ExitCode
from hybridflow.store.catalog import Catalog
from tests.clusters.test_attach import BIN, wait_for
from tests.support.netns import DRIVER_ADDRESS, Listener, Topology, address_allowed, netns_unavailable, process_tree

RAY_TOKEN = "hybridflow-multihost-token-0123456789"
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": RAY_TOKEN}
RAY_WORKER_PORTS = range(10002, 20000)  # Ray's default worker port range: the driver's core worker listens there
SPARK_PORT, SPARK_UI, DASK_PORT, RAY_PORT, HIDDEN_DASK_PORT = 7077, 8080, 8786, 6379, 8790

STAGES = '''
import pandas as pd


def make():
    ids = pd.Series(range(200), dtype="int64")
    return pd.DataFrame({"id": ids, "group": ids % 7})


def square(x):
    return x * x


def spark_square(numbers):
    from pyspark.sql import functions as F
    return numbers.select("id", "group", F.udf(square, "long")("id").alias("squared"))  # on an executor


def dask_total(squares):
    return squares.map_partitions(lambda p: p.assign(total=p["squared"] + p["group"]),
                                  meta=squares._meta.assign(total=squares._meta["squared"]))


def ray_scale(totals):
    return totals.map_batches(lambda b: b.assign(scaled=b["total"] * 0.5), batch_format="pandas")


def dask_first():
    import dask.dataframe as dd
    return dd.from_dict({"id": list(range(10))}, npartitions=1)
'''

PIPELINE = '''
name: {name}
{backends}
stages:
  make: {{run: "mypkg.steps:make", outputs: [numbers]}}
  squares: {{run: "mypkg.steps:spark_square", backend: spark, inputs: [numbers], outputs: [squares]}}
  totals: {{run: "mypkg.steps:dask_total", backend: dask, inputs: [squares], outputs: [totals]}}
  scaled: {{run: "mypkg.steps:ray_scale", backend: ray, inputs: [totals], outputs: [scaled]}}
'''

EMBEDDED = '''backends:
  spark: {master: "local[1]", conf: {spark.sql.shuffle.partitions: 2}}
  dask: {n_workers: 1, threads_per_worker: 1}
  ray: {num_cpus: 1}'''


@pytest.fixture(scope="module")
def hosts():
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    topology = Topology()
    try:
        topology.build(["head", "node"])
        yield topology
    finally:
        topology.remove()  # every process it started, by process group id, then the namespaces


@pytest.fixture(scope="module")
def clusters(hosts, tmp_path_factory):
    """The three clusters, up and with a worker each on "node"; their addresses by engine."""
    import pyspark

    logs = tmp_path_factory.mktemp("cluster-logs")
    head, node = hosts.hosts["head"], hosts.hosts["node"]
    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    ray_temp = tempfile.mkdtemp(prefix="hf-mh-")  # short: Ray's socket paths must fit in 107 bytes
    launch = hosts.launch

    try:
        spark = {"PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(logs), "SPARK_LOCAL_IP": head}
        launch("head", [spark_class, "org.apache.spark.deploy.master.Master", "--host", head,
                        "--port", str(SPARK_PORT), "--webui-port", str(SPARK_UI)], logs / "master.log", spark)
        launch("head", [str(BIN / "dask"), "scheduler", "--host", head, "--port", str(DASK_PORT),
                        "--no-dashboard", "--dashboard-address", f"{head}:0"], logs / "scheduler.log")
        ray_head = logs / "ray-head.log"
        launch("head", [str(BIN / "ray"), "start", "--head", "--block", "--port", str(RAY_PORT),
                        "--node-ip-address", head, "--include-dashboard=false", "--num-cpus", "1",
                        "--object-store-memory", str(200 * 2**20), "--temp-dir", f"{ray_temp}/head",
                        "--disable-usage-stats"], ray_head, {**RAY_ENV, "PYTHONUNBUFFERED": "1"})
        wait_for(lambda: "Ray runtime started." in ray_head.read_text(errors="replace"), "the ray head")
        launch("node", [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://{head}:{SPARK_PORT}",
                        "--host", node, "--cores", "1", "--memory", "1g", "--webui-port", "8081",
                        "--work-dir", str(logs / "spark-work")], logs / "spark-worker.log",
               {**spark, "SPARK_LOCAL_IP": node})
        launch("node", [str(BIN / "dask"), "worker", f"tcp://{head}:{DASK_PORT}", "--host", node,
                        "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
                        "--dashboard-address", f"{node}:0"], logs / "dask-worker.log")
        ray_node = logs / "ray-node.log"
        launch("node", [str(BIN / "ray"), "start", "--block", "--address", f"{head}:{RAY_PORT}",
                        "--node-ip-address", node, "--num-cpus", "1", "--object-store-memory",
                        str(200 * 2**20), "--temp-dir", f"{ray_temp}/node", "--disable-usage-stats"],
               ray_node, {**RAY_ENV, "PYTHONUNBUFFERED": "1"})
        wait_for(lambda: spark_workers(head) >= 1, "the spark worker")
        wait_for(lambda: dask_workers(f"tcp://{head}:{DASK_PORT}") >= 1, "the dask worker")
        wait_for(lambda: "Ray runtime started." in ray_node.read_text(errors="replace"), "the ray worker node")
        yield {"spark": f"spark://{head}:{SPARK_PORT}", "dask": f"tcp://{head}:{DASK_PORT}",
               "ray": f"{head}:{RAY_PORT}"}
    finally:
        hosts.stop()
        shutil.rmtree(ray_temp, ignore_errors=True)


def spark_workers(master: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{master}:{SPARK_UI}/json/", timeout=2) as answer:
            return json.load(answer).get("aliveworkers", 0)
    except OSError:
        return 0


def dask_workers(address: str) -> int:
    from distributed import Client

    try:
        with Client(address, timeout=5) as client:
            return len(client.scheduler_info(n_workers=-1)["workers"])
    except OSError:
        return 0


def run_cli(project, *args: str, listeners: Topology | None = None,
            env: dict | None = None) -> tuple[subprocess.CompletedProcess, list]:
    """`hybridflow ARGS` in its own process, as a user runs it; with `listeners`, the TCP listeners of its
    process tree and of every process the topology started, sampled with ss every second while it runs."""
    process = subprocess.Popen([sys.executable, "-m", "hybridflow.cli", *args], cwd=project.root, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               # executors run the python the driver names: this venv's, on every host here
                               env={**_environ(), **(env or {}), **RAY_ENV, "PYSPARK_PYTHON": sys.executable,
                                    "COLUMNS": "400"})  # doctor's table: a finding on one line
    seen: dict[tuple, tuple[Listener, set[int]]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(1.0):
            run = process_tree([process.pid])  # the command and the run's process it supervises
            pids = process_tree([process.pid, *(p.pid for p in listeners.processes)])
            for listener in listeners.listeners(pids):
                seen.setdefault((listener.namespace, listener.local, listener.processes), (listener, run))

    sampler = threading.Thread(target=sample, daemon=True)
    if listeners is not None:
        sampler.start()
    try:
        # the test's own timeout (pytest-timeout) bounds it first; this one only stops a run left behind
        output, _ = process.communicate(timeout=840)
    except subprocess.TimeoutExpired as late:
        said = late.output or b""  # bytes even in text mode: what came before the timeout
        said = (said.decode(errors="replace") if isinstance(said, bytes) else said)[-4000:]
        raise AssertionError(f"hybridflow {' '.join(args)} still running after 840 s; it said:\n{said}") from None
    finally:
        done.set()
        if process.poll() is None:
            process.kill()
            process.wait()
    if listeners is not None:
        sampler.join()
    result = subprocess.CompletedProcess(process.args, process.returncode, output, "")
    return result, list(seen.values())


def _environ() -> dict:
    import os

    return dict(os.environ)


def outputs(version) -> list[tuple]:
    table = read_arrow(version.source())
    return sorted(zip(*(table.column(c).to_pylist() for c in ("id", "group", "squared", "total", "scaled"))))


# What the pipeline gives on embedded engines, written out in plain Python: the same kind of stages run
# embedded against pandas in tests/engines/test_three_engines.py, so this test and the SSH clusters' compare
# the clusters with it without starting Spark, Dask and Ray embedded once more (16 s)
EMBEDDED_ANSWER = sorted((i, i % 7, i * i, i * i + i % 7, (i * i + i % 7) * 0.5) for i in range(200))


def attached_backends(clusters) -> str:
    return (f'backends:\n  spark: {{master: "{clusters["spark"]}", conf: {{spark.executor.memory: 512m, '
            f'spark.cores.max: 1, spark.sql.shuffle.partitions: 2}}}}\n'
            f'  dask: {{address: "{clusters["dask"]}"}}\n  ray: {{address: "{clusters["ray"]}"}}')


def test_three_engines_on_other_hosts_give_the_embedded_answer(clusters, hosts, project):
    project.stages(STAGES)
    project.pipeline(PIPELINE.format(name="attached", backends=attached_backends(clusters)), "attached.yaml")

    started = time.monotonic()
    run, listeners = run_cli(project, "run", "attached.yaml", listeners=hosts)
    assert run.returncode == 0, run.stdout
    assert outputs(Catalog(project.home("attached")).current("scaled")) == EMBEDDED_ANSWER
    assert all(process.poll() is None for process in hosts.processes)  # the clusters are not ours to stop

    # the driver side bound to the address that routes to the clusters: Spark's driver JVM and Ray's node
    # of this host listen on 10.213.0.1 in the root namespace
    driver_side = {listener.local.rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")
                   for listener, _ in listeners if listener.namespace == "root"}
    assert DRIVER_ADDRESS in driver_side, listeners
    assert not wrong_listeners(listeners, hosts), f"after {time.monotonic() - started:.0f} s"

    doctor, _ = run_cli(project, "doctor", "attached.yaml")
    workdir = project.root / ".hybridflow"
    for engine in ("spark", "dask", "ray"):
        finding = rf"ok\W+{engine} cluster\W+its workers see the workdir {workdir}"
        assert re.search(finding, doctor.stdout), doctor.stdout


def wrong_listeners(listeners: list[tuple[Listener, set[int]]], hosts: Topology) -> list[str]:
    """Listeners on an address outside 127.0.0.1 and the hosts' own, or on a wildcard. Ray 2.60 binds its
    GCS server, raylets and core workers to the wildcard whenever a node's address is not loopback (there
    is no option to bind them to the node's address), so wildcards are tolerated for Ray's processes
    only: those of the Ray launches, and the driver's own core worker (Ray's worker port range), in the
    command's process or the run's process it supervises."""
    ray_pids = process_tree([p.pid for p in hosts.processes if "ray" in " ".join(map(str, p.args))])
    wrong = []
    for listener, cli in listeners:
        host = listener.local.rsplit(":", 1)[0].strip("[]")
        wildcard = host in ("*", "0.0.0.0", "::")
        ray = bool(listener.pids & ray_pids) or "raylet" in listener.processes or "ray::" in listener.processes \
            or "gcs_server" in listener.processes or (listener.pids & cli and listener.port in RAY_WORKER_PORTS) \
            or _is_ray_driver_node(listener.pids)
        if (wildcard and not ray) or (not wildcard and not address_allowed(listener.local)):
            wrong.append(f"{listener.namespace}: {listener.local} {listener.processes}")
    return wrong


def _is_ray_driver_node(pids) -> bool:
    """A process of the Ray node hybridflow joins this host with (`ray start` and what it starts)."""
    for pid in pids:
        for ancestor in _ancestors(pid):
            try:
                if b"ray.scripts.scripts" in Path(f"/proc/{ancestor}/cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False


def _ancestors(pid: int) -> list[int]:
    found = []
    while pid > 1 and len(found) < 20:
        found.append(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


HIDDEN = '''
name: hidden
backends:
  dask: {{address: "{address}"}}
stages:
  first: {{run: "mypkg.steps:dask_first", backend: dask, outputs: [firsts]}}
'''


def test_a_workdir_the_workers_cannot_see_is_refused_before_any_data_moves(clusters, hosts, project, tmp_path):
    """A Dask worker in a mount namespace where an empty tmpfs covers tmp_path (the workdir's parent):
    the run and doctor both stop with the one-line error and exit 69, and nothing is published."""
    project.stages(STAGES)
    head, node = hosts.hosts["head"], hosts.hosts["node"]
    address = f"tcp://{head}:{HIDDEN_DASK_PORT}"
    logs = Path(tempfile.mkdtemp(prefix="hf-hidden-"))  # outside tmp_path, which the worker cannot see
    scheduler = hosts.launch("head", [str(BIN / "dask"), "scheduler", "--host", head, "--port",
                                      str(HIDDEN_DASK_PORT), "--no-dashboard", "--dashboard-address", f"{head}:0"],
                             logs / "scheduler.log")
    worker = hosts.launch("node", [str(BIN / "dask"), "worker", address, "--host", node, "--nworkers", "1",
                                   "--nthreads", "1", "--no-dashboard", "--dashboard-address", f"{node}:0"],
                          logs / "worker.log", hide=tmp_path)
    try:
        wait_for(lambda: dask_workers(address) >= 1, "the dask worker that cannot see the workdir")
        project.pipeline(HIDDEN.format(address=address), "hidden.yaml")
        workdir = project.root / ".hybridflow"
        expected = f"the workdir {workdir} is not shared with the dask cluster at {address}"

        run, _ = run_cli(project, "run", "hidden.yaml")
        assert run.returncode == ExitCode.UNAVAILABLE, run.stdout
        assert expected in run.stdout and "mount it on every node under the same path" in run.stdout, run.stdout
        assert Catalog(project.home("hidden")).current("firsts") is None

        doctor, _ = run_cli(project, "doctor", "hidden.yaml")
        assert doctor.returncode == ExitCode.UNAVAILABLE, doctor.stdout
        assert expected in doctor.stdout, doctor.stdout
        assert not list(workdir.glob(".hybridflow-shared-*"))  # the marker files are removed
    finally:
        hosts.stop([worker, scheduler])
        shutil.rmtree(logs, ignore_errors=True)
