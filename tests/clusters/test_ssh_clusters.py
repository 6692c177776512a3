"""Clusters brought up over SSH for a run and taken down after it. Three network namespaces stand for
three hosts (a: the head of each engine; b and c: workers), each running its own sshd (Debian's
openssh-server, started here on the host's address with a key made for the test) in a mount namespace
where an empty tmpfs covers PRIVATE, where the project and hybridflow's local cache lie: the hosts share
no filesystem with the runner, and the workdir is on an S3 server at 10.213.0.1. A python -> Spark ->
Dask -> Ray pipeline brings all three clusters up over SSH and gives the embedded run's answer; Spark's
cluster is gone while the Ray stage runs; while each engine's stage runs, a client on another host
without the run's credentials is refused by its cluster, whose folder on the hosts is 0700 (its
credentials 0600); no credential is in any command line, output, local file or the workdir; after the
run no process tagged with its clusters' names is left on any host, their folders are gone, and no
listener was on a wildcard address (Ray's exception aside). A head that cannot be the cluster's own (a
wrong python, a port a stranger holds, a folder another user holds) fails at once. After a kill -9 of
the runner, each host's tether ends the Dask and Spark clusters there, and `clusters reap` takes their
records and brings their logs back; a Dask cluster nobody uses ends itself at its idle timeout, with
no runner, tether or reaper. Needs root and openssh-server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from hybridflow.data.storage import ObjectPath
from hybridflow.data.stores.s3 import S3Settings
from hybridflow.data.stores.s3objects import S3ObjectStore
from hybridflow.execution.sshclusters import scratch
from hybridflow.store.objectcatalog import ObjectCatalog
from tests.clusters import test_multihost as multihost
from tests.clusters.test_multihost import DRIVER_ADDRESS, outputs, run_cli, wrong_listeners
from tests.objectstore.test_s3_workdir import statuses
from tests.support.netns import Topology, netns_unavailable
from tests.support.projects import Project
from tests.support.s3server import S3Server
from tests.support.sshhosts import CLIENT_OPTIONS, SSHD, start_sshd, three_host_cluster
from tests.support.strangers import port_open, try_dask, try_ray, try_spark

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


def wait_for_the_stranger(engine):
    """Hold the stage (its cluster up) while the test tries the cluster from another host without
    the run's credentials."""
    import os
    import time
    from pathlib import Path

    folder = Path(os.environ["HF_STRANGER"])
    (folder / f"{engine}.up").touch()
    deadline = time.monotonic() + 300
    while not (folder / f"{engine}.done").exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def spark_square_tried(numbers):
    wait_for_the_stranger("spark")
    return spark_square(numbers)


def dask_total_tried(squares):
    wait_for_the_stranger("dask")
    return dask_total(squares)


def ray_scale_tried(totals):
    wait_for_the_stranger("ray")
    return ray_scale_counting_spark(totals)


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
  squares: {{run: "mypkg.steps:spark_square_tried", backend: spark, inputs: [numbers], outputs: [squares]}}
  totals: {{run: "mypkg.steps:dask_total_tried", backend: dask, inputs: [squares], outputs: [totals]}}
  scaled: {{run: "mypkg.steps:ray_scale_tried", backend: ray, inputs: [totals], outputs: [scaled]}}
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


def holding(folders: list[str]) -> list[int]:
    """Processes on this machine with a file open in one of `folders` (deleted since, or not)."""
    found = []
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd).startswith(f"{folder}/") for folder in folders):
                found.append(int(fd.parts[2]))
    return sorted(set(found))


def hf_env(s3: S3Server, private: Path) -> dict[str, str]:
    return {**s3.env(), "HYBRIDFLOW_CACHE": str(private / "cache")}


CREDENTIALS = {"spark": ["spark-auth.properties"], "dask": ["dask-key.pem"], "ray": ["ray-token"]}


class Stranger(threading.Thread):
    """While each engine's stage holds its cluster up: the cluster's folders on the hosts (their modes,
    the credentials in them), and what a client on another host (this one, 10.213.0.1) without the
    run's credentials gets from it."""

    def __init__(self, folder: Path, head: str) -> None:
        super().__init__(daemon=True)
        self.folder, self.head = folder, head
        self.folders: dict[str, dict[str, int]] = {}  # folder -> its mode and each file's
        self.secrets: set[str] = set()
        self.tried: dict[str, object] = {}
        self.over = threading.Event()

    def run(self) -> None:
        for engine in ("spark", "dask", "ray"):
            while not (self.folder / f"{engine}.up").exists():
                if self.over.wait(0.2):
                    return
            try:
                self.look(engine)
            except Exception as exc:  # noqa: BLE001 - said in the test's assertions; the stage must go on
                self.tried.setdefault(engine, f"could not look: {exc!r}")
            finally:
                (self.folder / f"{engine}.done").touch()

    def look(self, engine: str) -> None:
        names = set()
        for pid in tagged("hf-sshflow-"):
            with contextlib.suppress(OSError):  # the cluster before this one, being taken down, ends meanwhile
                names.update(re.findall(rb"(?:^|\0)HYBRIDFLOW_CLUSTER_NAME=(hf-sshflow-[^\0]*-" + engine.encode()
                                        + rb")\0", Path(f"/proc/{pid}/environ").read_bytes()))
        for name in names:
            folder = Path(scratch(name.decode()))
            self.folders[str(folder)] = {path.name: path.stat().st_mode & 0o777 for path in [folder, *folder.iterdir()]}
            for file in CREDENTIALS[engine]:
                text = (folder / file).read_text()
                self.secrets.add(text.split("spark.authenticate.secret=")[1].split()[0] if engine == "spark" else text)
        if engine == "spark":
            self.tried[engine] = {"ui": port_open(self.head, 8080),
                                  "app": try_spark(f"spark://{self.head}:7077", DRIVER_ADDRESS)}
        elif engine == "dask":
            self.tried[engine] = try_dask(self.head)
        else:
            self.tried[engine] = try_ray(self.head)


def command_lines(seen: set[bytes], over: threading.Event) -> None:
    """Every process's command line on this machine (every host's), sampled until `over`."""
    while not over.wait(0.3):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                seen.add(Path(f"/proc/{pid}/cmdline").read_bytes())



def cluster_logs(private: Path, lines: int = 80) -> str:
    """The end of each cluster's log of the runs under `private`, for a failure's message: the folder
    is removed with the module, and with it what the hosts said."""
    return "".join(f"\n=== {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                   for log in sorted(private.rglob("cluster-*.log")))

def test_three_clusters_brought_up_over_ssh_give_the_embedded_answer_and_leave_nothing(
        hosts, sshd, s3, private, monkeypatch):
    project = Project(private / "flow")
    project.stages(STAGES)
    bucket = s3.bucket("sshflow")
    project.pipeline(PIPELINE.format(
        bucket=bucket,
        spark=ssh_cluster(hosts, sshd, "spark"), dask=ssh_cluster(hosts, sshd, "dask"),
        ray=ssh_cluster(hosts, sshd, "ray")))
    env = hf_env(s3, private)
    stranger = Stranger(private / "stranger", hosts.hosts["a"])
    stranger.folder.mkdir()
    seen: set[bytes] = set()
    sampler = threading.Thread(target=command_lines, args=(seen, stranger.over), daemon=True)
    stranger.start()
    sampler.start()
    try:
        run, listeners = run_cli(project, "run", "pipeline.yaml", listeners=hosts,
                                 env={**env, "HF_STRANGER": str(stranger.folder)})
    finally:
        stranger.over.set()
    stranger.join(200)
    sampler.join(10)
    assert run.returncode == 0, run.stdout + cluster_logs(private)
    assert set(statuses(run.stdout).values()) == {"done"}, run.stdout

    # nobody without the run's credentials got in; each cluster's folder was its own, and is gone
    assert stranger.tried["spark"]["ui"] is False, stranger.tried  # the master's web UI: loopback only
    assert stranger.tried["spark"]["app"].startswith("refused"), stranger.tried
    assert all(": refused" in outcome for outcome in stranger.tried["dask"]), stranger.tried["dask"]
    assert stranger.tried["ray"].startswith("refused"), stranger.tried
    assert len(stranger.folders) == 3 and len(stranger.secrets) == 3, (stranger.folders, stranger.secrets)
    for folder, modes in stranger.folders.items():
        assert modes.pop(Path(folder).name) == 0o700, (folder, modes)
        assert all(modes[file] == 0o600 for files in CREDENTIALS.values() for file in files if file in modes), modes
        assert not Path(folder).exists()
    # no credential, the run's own or the pipeline's ${env:...}, in any command line, output, log or the workdir
    secrets = {*stranger.secrets, s3.secret_key}
    assert not [line for line in seen for secret in secrets if secret.encode() in line]
    assert not [secret for secret in secrets if secret in run.stdout]
    for file in [p for p in (private / "cache").rglob("*") if p.is_file()]:
        assert not [secret for secret in secrets if secret.encode() in file.read_bytes()], file
    for key in s3.keys(f"{bucket}/"):
        body = s3.client().get_object(Bucket=bucket, Key=key.split("/", 1)[1])["Body"].read()
        assert not [secret for secret in secrets if secret.encode() in body], key

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    catalog = ObjectCatalog(private / "cache" / "sshflow", ObjectPath(f"{bucket}/wd/sshflow"),
                            S3ObjectStore(S3Settings.of()))
    scaled = catalog.current("scaled")
    assert outputs(scaled) == multihost.EMBEDDED_ANSWER
    from hybridflow.data.tables import read_arrow

    assert set(read_arrow(scaled.source()).column("spark_left").to_pylist()) == {0}  # Spark's cluster was gone
    assert tagged("hf-sshflow-") == []  # every cluster process, on every host, ended with the run
    assert holding(list(stranger.folders)) == []  # those that drop the tag too (Ray's agents)
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
    while held := listening(hosts, "a", (8786, 7077)):  # and their ports let go (an ending process's last step)
        assert time.monotonic() < deadline, held
        time.sleep(0.5)

    listed = run_cli(project, "clusters", "list", "pipeline.yaml", env=hf_env(s3, private))[0]
    assert "dask" in listed.stdout and "spark" in listed.stdout, listed.stdout  # the records stay for the reaper
    reaped = run_cli(project, "clusters", "reap", "pipeline.yaml", env=hf_env(s3, private))[0]
    assert reaped.returncode == 0 and "took down the dask cluster of run" in reaped.stdout, reaped.stdout
    assert "took down the spark cluster of run" in reaped.stdout, reaped.stdout
    assert s3.keys(f"{bucket}/wd/sshkill/clusters/") == []
    logs = next((private / "cache").rglob("cluster-spark.log")).read_text()  # the reaper brought the logs back
    assert "deploy.master.Master" in logs, logs


def listening(hosts: Topology, host: str, ports: tuple[int, ...]) -> str:
    """What listens on `ports` on the host, as `ss` tells it (empty: nothing)."""
    shown = hosts.run(host, ["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return "".join(line + "\n" for line in shown.splitlines() if any(f":{port} " in line for port in ports))


def command_line(pid: int) -> bytes:
    """The process's command line; empty once it has ended (a cluster's short-lived helpers do, any time)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_dask_cluster_nobody_uses_ends_itself_at_its_idle_timeout(hosts, sshd, tmp_path):
    """No runner, no tether, no reaper: the scheduler's own timer ends it. (Its timer runs from the
    scheduler's start: one shorter than a worker's start on a busy machine ends it before the worker
    joins, and the worker's start fails.)"""
    from hybridflow.execution.sshclusters import ssh_down, ssh_up
    from hybridflow.settings import ClusterSection

    spec = ClusterSection(provider="ssh", hosts=[{"host": hosts.hosts["a"], "head": True}, {"host": hosts.hosts["b"]}],
                          user="root", key_file=str(sshd), python=sys.executable, ssh_options=CLIENT_OPTIONS,
                          worker_args=["--nthreads", "1"], idle_timeout=20)  # well past a busy worker's start
    record = {"name": "hf-idle-test-dask", "run_id": "idle-test", "engine": "dask"}
    try:
        ssh_up("dask", spec, record, tmp_path / "cluster.log")
        scheduler = [pid for pid in tagged("hf-idle-test-") if b"dask_scheduler" in command_line(pid)]
        assert scheduler
        deadline = time.monotonic() + 90
        while any(Path(f"/proc/{pid}").exists() for pid in scheduler):
            assert time.monotonic() < deadline, "Dask's idle timeout did not end the scheduler"
            time.sleep(0.5)
    finally:
        assert ssh_down(record, spec, tmp_path / "cluster.log") is None
    assert tagged("hf-idle-test-") == []


# a head that serves on its port; a worker that exits the first time it starts on a host (an engine's own
# start-up timer run out, as Ray's 30 s do on a host kept busy), then joins; one that never says it joined
HEAD = ("import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); print('serving', flush=True); time.sleep(600)")
FLAKY = 'if [ -e "$1" ]; then echo joined; exec sleep 600; fi; touch "$1"; echo "Exception: timed out" >&2; exit 3'
SILENT = "exec sleep 600"


def test_a_worker_that_exits_before_it_joined_is_started_again_and_one_that_never_joins_fails_naming_its_host(
        hosts, sshd, tmp_path):
    """The cluster is up only once every worker says it joined: a worker that exits first is started
    again; one that is still not in at up_timeout fails the start, naming its host."""
    from hybridflow.engines import ClusterLaunch
    from hybridflow.errors import UnavailableError
    from hybridflow.execution.sshclusters import scratch, ssh_down, ssh_up
    from hybridflow.settings import ClusterSection

    a, b, c = (hosts.hosts[name] for name in ("a", "b", "c"))

    def up(name: str, worker: str, port: int) -> str:
        spec = ClusterSection(provider="ssh", hosts=[{"host": a, "head": True}, {"host": b}, {"host": c}],
                              user="root", key_file=str(sshd), python=sys.executable, ssh_options=CLIENT_OPTIONS,
                              up_timeout=20)
        launch = ClusterLaunch(f"{a}:{port}", port, [sys.executable, "-c", HEAD, a, str(port)],
                               lambda host: ["bash", "-c", worker, "worker", f"{scratch(name)}/tried-{host}"],
                               grace=0.5, head_ready="serving", joined="joined")
        record = {"name": name, "run_id": name, "engine": "dask"}
        try:
            ssh_up("dask", spec, record, tmp_path / f"{name}.log", launch=launch)
            return "up"
        except UnavailableError as exc:
            return str(exc)
        finally:
            assert ssh_down(record, spec, tmp_path / f"{name}.log") is None
            assert tagged(name) == []

    assert up("hf-flaky-1-dask", FLAKY, 8791) == "up"
    log = (tmp_path / "hf-flaky-1-dask.log").read_text()
    for host in (b, c):
        assert log.count(f"worker on {host} exited before it was up: starting it again") == 1, log
        assert "Exception: timed out" in log, log
    clock = time.monotonic()
    said = up("hf-silent-1-dask", SILENT, 8792)
    assert said.startswith(f"the dask cluster's worker on {b} was not up within 20 s") or \
        said.startswith(f"the dask cluster's worker on {c} was not up within 20 s"), said
    assert time.monotonic() - clock < 60, said


# a stranger's service (SO_REUSEADDR: an earlier test's connections to the port may linger in TIME_WAIT)
LISTENER = ("import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); time.sleep(600)")


def test_a_head_that_cannot_be_the_clusters_own_fails_at_once_and_is_never_attached_to(hosts, sshd, tmp_path):
    """A wrong `python:` fails with the host's own error, not at up_timeout; a port on the head host held
    by another process (another run's cluster, a stranger's service) is refused, naming host and port;
    a cluster folder another user holds there is refused."""
    from hybridflow.errors import UnavailableError
    from hybridflow.execution.sshclusters import ssh_down, ssh_up
    from hybridflow.settings import ClusterSection

    a = hosts.hosts["a"]

    def up(name: str, **changes) -> str:
        spec = ClusterSection(**{"provider": "ssh", "hosts": [{"host": a, "head": True}], "user": "root",
                                 "key_file": str(sshd), "python": sys.executable, "ssh_options": CLIENT_OPTIONS,
                                 "up_timeout": 60, **changes})
        record = {"name": name, "run_id": name, "engine": "dask"}
        try:
            ssh_up("dask", spec, record, tmp_path / f"{name}.log")
            return "attached"
        except UnavailableError as exc:
            return str(exc)
        finally:
            assert ssh_down(record, spec, tmp_path / f"{name}.log") is None

    said = up("hf-wrongpython-1-dask", python="/opt/nowhere/bin/python")
    assert "exited at once" in said and "/opt/nowhere/bin/python" in said, said

    stranger = hosts.launch("a", [sys.executable, "-c", LISTENER, a, "8786"], tmp_path / "stranger.log")
    try:
        deadline = time.monotonic() + 30
        while not port_open(a, 8786):
            assert time.monotonic() < deadline, (tmp_path / "stranger.log").read_text()
            time.sleep(0.2)
        said = up("hf-porttaken-1-dask")
    finally:
        hosts.stop([stranger])
    assert f"head on {a}: port 8786 there is held by a process not of this cluster" in said, said

    taken = Path(scratch("hf-otheruser-1-dask"))
    taken.mkdir()
    os.chown(taken, 65534, 65534)
    try:
        said = up("hf-otheruser-1-dask")
    finally:
        shutil.rmtree(taken)
    assert "is not a folder of this user's own" in said, said
    assert tagged("hf-wrongpython-") == tagged("hf-porttaken-") == tagged("hf-otheruser-") == []


# a listener with no environment at all: what the head's host shows of a process that is ending (its
# memory, and so its environment, gone before its sockets close); it lets its port go once the head
# started meanwhile said it could not have it (argv[3]: the head's log), or after a minute
ENDING = ("import pathlib, socket, sys, time; s = socket.socket(); "
          "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], int(sys.argv[2]))); "
          "s.listen(); print('holding', flush=True); log = pathlib.Path(sys.argv[3]); end = time.monotonic() + 60\n"
          "while time.monotonic() < end and 'in use' not in (log.read_text().lower() if log.exists() else ''):\n"
          "    time.sleep(0.1)")


@pytest.mark.parametrize(("engine", "port", "head"), [("dask", 8786, b"dask_scheduler"),
                                                     ("spark", 7077, b"deploy.master.Master")])
def test_a_head_port_still_held_by_an_ending_process_is_waited_for_then_the_head_started_again(
        hosts, sshd, tmp_path, engine, port, head):
    """The last cluster's head ending as the next one starts (a killed run's, torn down by its tether):
    its port is waited for, and the head that could not bind it started again; not refused as a
    stranger's, and not moved to another port (Spark's master tries the next ones unless told not to)."""
    from hybridflow.execution.sshclusters import ssh_down, ssh_up
    from hybridflow.settings import ClusterSection

    a = hosts.hosts["a"]
    record = {"name": f"hf-ending-1-{engine}", "run_id": "ending-1", "engine": engine}
    head_log = f"{scratch(record['name'])}/head.log"
    ending = hosts.launch("a", ["env", "-i", sys.executable, "-c", ENDING, a, str(port), head_log],
                          tmp_path / "ending.log")
    spec = ClusterSection(provider="ssh", hosts=[{"host": a, "head": True}], user="root", key_file=str(sshd),
                          python=sys.executable, ssh_options=CLIENT_OPTIONS, up_timeout=120)
    try:
        deadline = time.monotonic() + 30
        while not port_open(a, port):
            assert time.monotonic() < deadline and ending.poll() is None, (tmp_path / "ending.log").read_text()
            time.sleep(0.2)
        up = ssh_up(engine, spec, record, tmp_path / "cluster.log")
        assert ending.poll() is not None  # up only after the ending holder let its port go
        said = (tmp_path / "cluster.log").read_text()
        assert f"the {engine} cluster's head on {a} exited at once: starting it again" in said, said
        assert up["address"].endswith(f"{a}:{port}"), up
        assert [pid for pid in tagged("hf-ending-1-") if head in command_line(pid)]
    finally:
        hosts.stop([ending])
        assert ssh_down(record, spec, tmp_path / "cluster.log") is None
    assert tagged("hf-ending-1-") == []
