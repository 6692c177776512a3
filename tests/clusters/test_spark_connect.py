"""Spark through Spark Connect: pyspark's own Connect server (the SparkConnectServer class that
start-connect-server.sh launches, from the jars in the wheel), started here on 127.0.0.1 with a
bearer token and stopped by process id. A pipeline attached with `remote:` and `token:` runs a Spark
stage whose UDF calls a helper of the stage package (shipped as a session artifact) and gives its
answer; a stage that reaches for sparkContext fails with one line naming the stage and
the call; a wrong token is one line and exit 69. A second server, in a network namespace standing for
another host and bound to its address alone, gives the same answer."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridflow.data.tables import read_arrow
from hybridflow.errors import ExitCode
from hybridflow.store.catalog import Catalog
from tests.support.netns import Topology, address_allowed, netns_unavailable, process_tree
from tests.support.projects import Project

pytestmark = pytest.mark.timeout(600)
TOKEN = secrets.token_hex(16)
HOST_PORT = 15002  # Spark Connect's own default, on the namespace host's address

STAGES = '''
import pandas as pd

from .helpers import label


def make():
    return pd.DataFrame({"id": pd.Series(range(50), dtype="int64")})


def labelled(numbers):
    from pyspark.sql import functions as F
    return numbers.withColumn("label", F.udf(label, "string")("id"))  # runs on the server's Python workers


def uses_the_context(numbers, ctx):
    return ctx.spark.sparkContext.parallelize([1, 2, 3]).toDF(["x"])
'''

PIPELINE = '''
name: {name}
backends:
  spark: {backend}
stages:
  make: {{run: "mypkg.steps:make", outputs: [numbers]}}
  labelled: {{run: "mypkg.steps:{function}", backend: spark, inputs: [numbers], outputs: [labelled]}}
'''


def server_command(address: str, port: int) -> list[str]:
    """pyspark's own Connect server, bound to `address` (its gRPC port and its driver)."""
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    return [str(submit), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name", "hybridflow-test-connect", "--master", "local[1]",
            "--conf", f"spark.connect.grpc.binding.address={address}",
            "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.ui.enabled=false",
            "--conf", f"spark.driver.bindAddress={address}", "--conf", f"spark.driver.host={address}"]


def wait_for_server(server: subprocess.Popen, address: str, port: int, log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """On 127.0.0.1, with a bearer token."""
    log = tmp_path_factory.mktemp("connect") / "server.log"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "SPARK_CONNECT_AUTHENTICATE_TOKEN": TOKEN, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable}
    with open(log, "wb") as out:
        server = subprocess.Popen(server_command("127.0.0.1", port), stdout=out, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)
    try:
        wait_for_server(server, "127.0.0.1", port, log)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def project_for(tmp_path: Path) -> Project:
    project = Project(tmp_path)
    project.stages(STAGES)
    project.write("mypkg/helpers.py", "def label(x):\n    return f'n{x:03d}'\n")
    return project


def hf(project: Project, *args: str, token: str = TOKEN) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], cwd=project.root, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "CONNECT_TOKEN": token, "COLUMNS": "300"})


def connect(port: int) -> str:
    return f'{{remote: "sc://localhost:{port}", token: "${{env:CONNECT_TOKEN}}", ' \
           f'conf: {{spark.sql.shuffle.partitions: 2}}}}'


def test_a_pipeline_attached_through_spark_connect_gives_the_answer(connect_server, tmp_path):
    project = project_for(tmp_path)
    project.pipeline(PIPELINE.format(name="connected", backend=connect(connect_server), function="labelled"))
    run = hf(project, "run", "pipeline.yaml")
    assert run.returncode == 0, run.stdout + run.stderr
    table = read_arrow(Catalog(project.home("connected")).current("labelled").source())
    # what embedded Spark gives (tests/engines/test_backends.py holds the engines to one contract)
    assert sorted(zip(table.column("id").to_pylist(), table.column("label").to_pylist())) == \
        [(i, f"n{i:03d}") for i in range(50)]
    assert table.schema.field("label").type == "string"
    assert TOKEN not in run.stdout + run.stderr
    assert not [f for f in project.home("connected").rglob("*") if f.is_file() and TOKEN.encode() in f.read_bytes()]


def test_a_stage_using_what_connect_does_not_offer_fails_in_one_line(connect_server, tmp_path):
    project = project_for(tmp_path)
    project.pipeline(PIPELINE.format(name="rdd", backend=connect(connect_server), function="uses_the_context"))
    run = hf(project, "run", "pipeline.yaml")
    assert run.returncode != 0
    said = run.stdout + run.stderr
    failure = next(line for line in said.splitlines() if line.startswith("labelled failed"))
    assert "sparkContext" in failure and "Spark Connect" in failure, said
    assert "Traceback" not in said


def test_a_wrong_token_is_one_line_and_exit_69(connect_server, tmp_path):
    project = project_for(tmp_path)
    project.pipeline(PIPELINE.format(name="refused", backend=connect(connect_server), function="labelled"))
    run = hf(project, "run", "pipeline.yaml", token="not-the-token")
    assert run.returncode == ExitCode.UNAVAILABLE, run.stdout + run.stderr
    assert "cannot attach to the Spark Connect server at sc://localhost:" in run.stdout + run.stderr
    assert "not-the-token" not in run.stdout + run.stderr


def test_a_pipeline_attached_to_a_connect_server_on_another_host_gives_the_answer(tmp_path):
    """The server in a network namespace of its own, bound to that host's address only; no token: a
    bearer token off loopback needs TLS, which Spark's Connect server leaves to a proxy in front."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    hosts = Topology()
    try:
        hosts.build(["connect"])
        address = hosts.hosts["connect"]
        server = hosts.launch("connect", server_command(address, HOST_PORT), tmp_path / "server.log",
                              {"SPARK_LOCAL_IP": address, "PYSPARK_PYTHON": sys.executable})
        wait_for_server(server, address, HOST_PORT, tmp_path / "server.log")
        project = project_for(tmp_path / "project")
        backend = f'{{remote: "sc://{address}:{HOST_PORT}", conf: {{spark.sql.shuffle.partitions: 2}}}}'
        project.pipeline(PIPELINE.format(name="elsewhere", backend=backend, function="labelled"))
        run = hf(project, "run", "pipeline.yaml")
        assert run.returncode == 0, run.stdout + run.stderr
        table = read_arrow(Catalog(project.home("elsewhere")).current("labelled").source())
        assert sorted(zip(table.column("id").to_pylist(), table.column("label").to_pylist())) == \
            [(i, f"n{i:03d}") for i in range(50)]
        listeners = [listener for listener in hosts.listeners({server.pid} | process_tree([server.pid]))
                     if listener.namespace == "connect"]
        assert listeners and all(address_allowed(listener.local) for listener in listeners), listeners
    finally:
        hosts.remove()
