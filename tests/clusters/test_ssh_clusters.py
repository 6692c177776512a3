"""Clusters brought up over SSH for a run and taken down after it. Three network namespaces stand for
three hosts (a: the head of each engine; b and c: workers), each running its own sshd (Debian's
openssh-server, started here on the host's address with a key made for the test) in a mount namespace
where an empty tmpfs covers PRIVATE, where the project and hybridflow's local cache lie: the hosts share
no filesystem with the runner, and the workdir is on an S3 server at 10.213.0.1. A python -> Spark ->
Dask -> Ray pipeline brings all three clusters up over SSH and gives the embedded run's answer; Spark's
cluster is gone while the Ray stage runs; after the run no process tagged with its clusters' names is
left on any host and no listener was on a wildcard address (Ray's exception aside). After a kill -9 of
the runner, each host's tether ends the Dask and Spark clusters there, and `clusters reap` takes their
records and brings their logs back; a Dask cluster nobody uses ends itself at its idle timeout, with
no runner, tether or reaper. Needs root and openssh-server."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hybridflow.data.storage import ObjectPath, StoreSettings
from hybridflow.store.objectcatalog import ObjectCatalog
from tests.clusters import test_multihost as multihost
from tests.clusters.test_multihost import DRIVER_ADDRESS, RAY_ENV, outputs, run_cli, wrong_listeners
from tests.objectstore.test_s3_workdir import statuses
from tests.support.netns import Topology, netns_unavailable
from tests.support.projects import Project
from tests.support.s3server import S3Server
from tests.support.sshhosts import CLIENT_OPTIONS, SSHD, start_sshd, three_host_cluster

pytestmark = pytest.mark.timeout(900)

# the multi-host pipeline's stages, and a Ray stage that also counts the Spark cluster's processes left
STAGES = multihost.STAGES + '''

def spark_processes() -> int:
    """Processes of this pipeline's Spark cluster still running on this machine (the hosts share it),
    given 60 s to end: it is taken down beside the stages after its own."""
    import os
    import re
    import time

    deadline = time.monotonic() + 60
    while True:
        found = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                environ = open(f"/proc/{pid}/environ", "rb").read()
            except OSError:
                continue
            found += bool(re.search(rb"(^|\\0)HYBRIDFLOW_CLUSTER_NAME=hf-sshflow-[^\\0]*-spark\\0", environ))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def ray_scale_counting_spark(totals):
    return totals.map_batches(lambda b: b.assign(scaled=b["total"] * 0.5, spark_left=spark_processes()),
                              batch_format="pandas")


def dask_slow(numbers):
    import time
    time.sleep(600)
    return numbers


def spark_after_slow(slowed):
    return slowed
'''


def ssh_cluster(hosts: Topology, key: Path, engine: str) -> str:
    """The engine's cluster section, as YAML (JSON is)."""
    return json.dumps(three_host_cluster(hosts, key, engine))


PIPELINE = '''
name: sshflow
workdir: s3://{bucket}/wd
backends:
  spark:
    conf: {{spark.executor.memory: 512m, spark.cores.max: 2, spark.sql.shuffle.partitions: 2}}
    cluster: {spark}
  dask:
    cluster: {dask}
  ray:
    cluster: {ray}
stages:
  make: {{run: "mypkg.steps:make", outputs: [numbers]}}
  squares: {{run: "mypkg.steps:spark_square", backend: spark, inputs: [numbers], outputs: [squares]}}
  totals: {{run: "mypkg.steps:dask_total", backend: dask, inputs: [squares], outputs: [totals]}}
  scaled: {{run: "mypkg.steps:ray_scale_counting_spark", backend: ray, inputs: [totals], outputs: [scaled]}}
'''

KILLED = '''
name: sshkill
workdir: s3://{bucket}/wd
backends:
  dask:
    cluster: {dask}
  spark:
    conf: {{spark.executor.memory: 512m, spark.cores.max: 1}}
    cluster: {spark}
stages:
  make: {{run: "mypkg.steps:make", outputs: [numbers]}}
  slow: {{run: "mypkg.steps:dask_slow", backend: dask, inputs: [numbers], outputs: [slowed]}}
  after: {{run: "mypkg.steps:spark_after_slow", backend: spark, inputs: [slowed], outputs: [after]}}
'''


@pytest.fixture(scope="module")
def hosts():
    reason = netns_unavailable() or (None if SSHD.exists() else "openssh-server is not installed")
    if reason:
        pytest.skip(reason)
    topology = Topology()
    try:
        topology.build(["a", "b", "c"])
        yield topology
    finally:
        topology.remove()


@pytest.fixture(scope="module")
def private():
    folder = Path(tempfile.mkdtemp(prefix="hf-ssh-private-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def sshd(hosts, private, tmp_path_factory) -> Path:
    """An sshd on each host's address, in a mount namespace where PRIVATE is hidden; the client key."""
    yield start_sshd(hosts, tmp_path_factory.mktemp("ssh"), hide=private)
    hosts.stop()


@pytest.fixture(scope="module")
def s3(hosts, tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3") / "moto.log", host=DRIVER_ADDRESS).start()
    yield server
    server.stop()


def niceness(pid: int) -> int | None:
    """A process's niceness, or None once it has ended."""
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except ProcessLookupError:
        return None


def tagged(prefix: str) -> list[int]:
    """Processes on this machine (every host's: they share it) tagged with a cluster name starting so."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and re.search(rb"(^|\0)HYBRIDFLOW_CLUSTER_NAME=" + re.escape(prefix.encode()), environ):
            found.append(int(pid))
    return found


def hf_env(s3: S3Server, private: Path) -> dict[str, str]:
    return {**s3.env(), "HYBRIDFLOW_CACHE": str(private / "cache"), **RAY_ENV}


def test_three_clusters_brought_up_over_ssh_give_the_embedded_answer_and_leave_nothing(
        hosts, sshd, s3, private, embedded_answer, monkeypatch):
    project = Project(private / "flow")
    project.stages(STAGES)
    bucket = s3.bucket("sshflow")
    project.pipeline(PIPELINE.format(
        bucket=bucket,
        spark=ssh_cluster(hosts, sshd, "spark"), dask=ssh_cluster(hosts, sshd, "dask"),
        ray=ssh_cluster(hosts, sshd, "ray")))
    env = hf_env(s3, private)
    run, listeners = run_cli(project, "run", "pipeline.yaml", listeners=hosts, env=env)
    assert run.returncode == 0, run.stdout
    assert set(statuses(run.stdout).values()) == {"done"}, run.stdout

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    catalog = ObjectCatalog(private / "cache" / "sshflow", ObjectPath(f"{bucket}/wd/sshflow"), StoreSettings.of())
    scaled = catalog.current("scaled")
    assert outputs(scaled) == embedded_answer
    from hybridflow.data.tables import read_arrow

    assert set(read_arrow(scaled.source()).column("spark_left").to_pylist()) == {0}  # Spark's cluster was gone
    assert tagged("hf-sshflow-") == []  # every cluster process, on every host, ended with the run
    assert not wrong_listeners(listeners, hosts), listeners
    logs = next((private / "cache").rglob("cluster-dask.log")).read_text()
    assert "distributed.scheduler" in logs and "=== " in logs  # the hosts' own logs came back with the run
    assert "AWS_SECRET_ACCESS_KEY" not in logs and s3.secret_key not in logs
    listed = run_cli(project, "clusters", "list", "pipeline.yaml", env=env)[0]
    assert "no cluster is up" in listed.stdout, listed.stdout
    shown = run_cli(project, "show", "last", "-f", "pipeline.yaml", env=env)[0].stdout
    for engine in ("spark", "dask", "ray"):  # each on three hosts, busy while its stage ran, and taken down
        assert re.search(rf"{engine}\W+3\W+[\d.]+s\W+[\d.]+s\W+[\d.]+s\W+[\d.]+s\W+[\d,]+\W+ok", shown), shown


def test_after_a_kill_9_the_tethers_end_every_cluster_and_the_reaper_its_records(hosts, sshd, s3, private):
    project = Project(private / "killed")
    project.stages(STAGES)
    bucket = s3.bucket("sshkill")
    project.pipeline(KILLED.format(bucket=bucket, dask=ssh_cluster(hosts, sshd, "dask"),
                                   spark=ssh_cluster(hosts, sshd, "spark")))
    env = {**os.environ, **hf_env(s3, private)}
    run = subprocess.Popen([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml"], cwd=project.root,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)

    def states() -> list:
        return [json.loads(s3.client().get_object(Bucket=bucket, Key=key.split("/", 1)[1])["Body"].read())
                .get("state") for key in s3.keys(f"{bucket}/wd/sshkill/clusters/")]
    try:
        deadline = time.monotonic() + 180
        while states() != ["up", "up"]:  # both brought up early, while the slow Dask stage runs
            assert time.monotonic() < deadline and run.poll() is None, run.communicate()[0] if run.poll() else ""
            time.sleep(0.5)
        while not any("calling mypkg.steps:dask_slow" in log.read_text(errors="replace")
                      for log in (private / "cache").rglob("sshkill/runs/*/logs/slow.log")):
            # the slow stage is under way: attached to its cluster, whose workers have joined
            assert time.monotonic() < deadline and run.poll() is None, run.communicate()[0] if run.poll() else ""
            time.sleep(0.2)
        engines = {engine: [pid for pid in tagged("hf-sshkill-") if name in command_line(pid)]
                   for engine, name in (("dask", b"dask_scheduler"), ("spark", b"deploy.master.Master"))}
        assert all(engines.values()), engines
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)  # the supervisor and the run: nothing of hybridflow tears down
            run.wait()
    # each host's tether saw the runner's end close and ended the cluster there (10 s of grace, then SIGKILL)
    deadline = time.monotonic() + 60
    while tagged("hf-sshkill-"):
        assert time.monotonic() < deadline, [command_line(pid)[:80] for pid in tagged("hf-sshkill-")]
        time.sleep(0.5)

    listed = run_cli(project, "clusters", "list", "pipeline.yaml", env=hf_env(s3, private))[0]
    assert "dask" in listed.stdout and "spark" in listed.stdout, listed.stdout  # the records stay for the reaper
    reaped = run_cli(project, "clusters", "reap", "pipeline.yaml", env=hf_env(s3, private))[0]
    assert reaped.returncode == 0 and "took down the dask cluster of run" in reaped.stdout, reaped.stdout
    assert "took down the spark cluster of run" in reaped.stdout, reaped.stdout
    assert s3.keys(f"{bucket}/wd/sshkill/clusters/") == []
    logs = next((private / "cache").rglob("cluster-spark.log")).read_text()  # the reaper brought the logs back
    assert "deploy.master.Master" in logs, logs


def command_line(pid: int) -> bytes:
    """The process's command line; empty once it has ended (a cluster's short-lived helpers do, any time)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_dask_cluster_nobody_uses_ends_itself_at_its_idle_timeout(hosts, sshd, tmp_path):
    """No runner, no tether, no reaper: the scheduler's own timer ends it. (Brought up as behind a
    running stage: its processes run at the lower CPU priority asked for.)"""
    from hybridflow.execution.sshclusters import ssh_down, ssh_up
    from hybridflow.settings import ClusterSection

    spec = ClusterSection(provider="ssh", hosts=[{"host": hosts.hosts["a"], "head": True}, {"host": hosts.hosts["b"]}],
                          user="root", key_file=str(sshd), python=sys.executable, ssh_options=CLIENT_OPTIONS,
                          worker_args=["--nthreads", "1"], idle_timeout=5)
    record = {"name": "hf-idle-test-dask", "run_id": "idle-test", "engine": "dask"}
    try:
        ssh_up("dask", spec, record, tmp_path / "cluster.log", niceness=19)
        scheduler = [pid for pid in tagged("hf-idle-test-") if b"dask_scheduler" in command_line(pid)]
        assert scheduler
        assert {niceness(pid) for pid in tagged("hf-idle-test-")} - {None} == {19}
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() for pid in scheduler):
            assert time.monotonic() < deadline, "Dask's idle timeout did not end the scheduler"
            time.sleep(0.5)
    finally:
        assert ssh_down(record, spec, tmp_path / "cluster.log") is None
    assert tagged("hf-idle-test-") == []
