"""Stops that must work whatever the stage is blocked in: a Ray stage waiting in ray.get on a task or
an actor call that sleeps for an hour, a Spark or Dask stage waiting on an hour-long job, and a stage
busy in one endless native call (numpy) are stopped by their timeout, SIGTERM and SIGINT within
seconds; SIGTERM while Spark is still starting leaves no JVM behind. Every run exits with its
documented code, is recorded, publishes nothing, and leaves no engine process."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import psutil
import pytest

from tests.engines.test_faults import start, wait_for
from tests.engines.test_three_engines import finish
from tests.support.engines import assert_nothing_left
from tests.support.projects import last_run_record

pytestmark = pytest.mark.timeout(900)

STAGES = '''
import time

import pandas as pd


def waits_on_task(ctx):
    @ctx.ray.remote
    def sleepy():
        time.sleep(3600)
        return 1

    ctx.log.info("waiting")
    ctx.ray.get(sleepy.remote())
    return pd.DataFrame({"x": [1]})


def waits_on_actor(ctx):
    @ctx.ray.remote
    class Sleeper:
        def sleep(self):
            time.sleep(3600)
            return 1

    sleeper = Sleeper.remote()
    ctx.log.info("waiting")
    ctx.ray.get(sleeper.sleep.remote())
    return pd.DataFrame({"x": [1]})


def _sleepy(part):
    time.sleep(3600)
    return part


def waits_on_dask(ctx):
    import dask.dataframe as dd

    frame = dd.from_pandas(pd.DataFrame({"x": range(4)}), npartitions=2)
    ctx.log.info("waiting")
    return frame.map_partitions(_sleepy, meta=frame._meta)  # computed while the runner writes it


def waits_on_spark(ctx):
    from pyspark.sql.functions import udf

    sleepy = udf(lambda x: time.sleep(3600) or x, "long")
    ctx.log.info("waiting")
    return ctx.spark.range(4).withColumn("x", sleepy("id"))


def busy_in_native_code(ctx):
    import numpy as np

    ctx.log.info("waiting")
    m = np.ones((7000, 7000))
    while True:
        m @ m  # one call of many seconds, which no Python signal handler can interrupt


def blocked_in_one_native_call(ctx, held):
    import sqlite3

    database = sqlite3.connect(held, timeout=600)
    ctx.log.info("waiting")
    # one C call, which releases the GIL and never returns to the interpreter in between: SQLite's busy
    # handler sleeps and retries inside it until the test lets go of the database it holds
    database.execute("BEGIN EXCLUSIVE")
    database.rollback()
    return pd.DataFrame({"x": [1]})


def spark_etl(ctx):
    return ctx.spark.createDataFrame(pd.DataFrame({"x": [1, 2]}))
'''


def pipeline(project, backend: str, function: str, extra: str = "") -> None:
    project.stages(STAGES)
    project.pipeline(f'''
    name: stopping
    backends:
      ray: {{num_cpus: 2}}
      spark: {{master: "local[1]"}}
    stages:
      work: {{run: "mypkg.steps:{function}", backend: {backend}, outputs: [out]{extra}}}
    ''')


def stage_waiting(project):
    def found() -> bool:
        logs = sorted(project.home("stopping").glob("runs/*/logs/work.log"))
        return bool(logs) and "waiting" in logs[-1].read_text()
    return found


# a timeout ends the stage and drops the engine, a signal ends the run: each on a task and on an actor,
# SIGTERM and SIGINT once each
@pytest.mark.parametrize("function, stop, code", [
    ("waits_on_task", "timeout", 124), ("waits_on_actor", "timeout", 124),
    ("waits_on_task", signal.SIGTERM, 143), ("waits_on_actor", signal.SIGINT, 130),
], ids=["timeout-waits_on_task", "timeout-waits_on_actor", "sigterm-waits_on_task", "sigint-waits_on_actor"])
def test_a_ray_stage_blocked_in_ray_get_is_stopped(project, function, stop, code):
    # a run that waited for its hour-long task would blow through 50 s; Ray's own GCS timeout is 60 s
    stopped(project, "ray", function, stop, code, "the stage to wait in ray.get", seconds=50)


def stopped(project, backend: str, function: str, stop, code: int, waiting: str, seconds: float) -> str:
    """Run `function` as the one stage, stop it (by its 3 s timeout, or by sending `stop` once it
    works), and check what every stop must give: `code` within `seconds`, no process left, the run
    and the stage recorded as stopped, nothing published. Returns what the run printed."""
    pipeline(project, backend, function, ", timeout: 3" if stop == "timeout" else "")
    process, marker = start(project)
    wait_for(stage_waiting(project), waiting, process, seconds=300)
    if stop != "timeout":
        process.send_signal(stop)
    output = finish(process, seconds, f"the run after {stop} (its stage never ends by itself)")
    assert process.returncode == code, output
    assert_nothing_left(marker, 60)
    run, stages = last_run_record(project.root / ".hybridflow")
    assert run["status"] == ("failed" if stop == "timeout" else "interrupted"), run
    assert stages["work"]["status"] == "failed"
    assert not (project.home("stopping") / "datasets" / "out").exists()  # nothing published
    return output


STOPS = {"timeout": ("timeout", 124), "sigterm": (signal.SIGTERM, 143), "sigint": (signal.SIGINT, 130)}


@pytest.mark.parametrize("backend, function, stop", [
    ("python", "busy_in_native_code", "timeout"),  # with a timeout, python stages run in a killable child
    ("python", "busy_in_native_code", "sigterm"),  # without one, in-process: ended around when stuck
    ("dask", "busy_in_native_code", "timeout"),  # the driver itself is stuck: the run is ended around it
    ("dask", "waits_on_dask", "sigterm"),  # waits in compute(): the cancel returns it
    ("spark", "waits_on_spark", "sigint"),  # waits on a job (timeouts of Spark jobs: test_faults)
])
def test_a_stage_blocked_in_its_engine_or_in_native_code_is_stopped(project, backend, function, stop):
    stop, code = STOPS[stop]
    output = stopped(project, backend, function, stop, code, f"the {backend} stage to start its endless work",
                     seconds=45)
    assert "backend" in output  # the summary table (its header) was printed all the same


def stage_started(project, marker: str):
    """The stage has begun and waits for its engine, which starts meanwhile (pyspark being imported,
    or the JVM launching): the run's stop handlers are in place from here on."""
    def found() -> bool:
        logs = sorted(project.home("stopping").glob("runs/*/logs/work.log"))
        return bool(logs) and "running: " in logs[-1].read_text()
    return found


def the_jvm(marker: str) -> psutil.Process | None:
    """The run's JVM (pyspark's launcher, then the driver it starts), once it has been exec'd."""
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if marker in process.environ().get("HYBRIDFLOW_TEST_RUN", "") and "java" in process.name():
                return process
    return None


def jvm_launched(project, marker: str):
    started = stage_started(project, marker)
    return lambda: started() and the_jvm(marker) is not None


def jvm_listening(project, marker: str):
    """The JVM listens: its Py4J gateway is up, and pyspark connects to it and creates the SparkContext."""
    started = stage_started(project, marker)

    def found() -> bool:
        jvm = the_jvm(marker) if started() else None
        with contextlib.suppress(psutil.Error):
            return jvm is not None and any(c.status == psutil.CONN_LISTEN for c in jvm.net_connections("inet"))
        return False
    return found


@pytest.mark.parametrize("moment", [stage_started, jvm_launched, jvm_listening],
                         ids=["stage-waits-for-spark", "jvm-launched", "jvm-listening"])
def test_sigterm_while_spark_starts_leaves_no_jvm(project, moment):
    pipeline(project, "spark", "spark_etl")
    process, marker = start(project)
    # each moment of start-up is waited for, not slept to: on a slow machine a fixed delay lands earlier
    wait_for(moment(project, marker), f"the moment of Spark's start-up ({moment.__name__})", process, seconds=120)
    process.send_signal(signal.SIGTERM)
    output = finish(process, 120, "the run after SIGTERM")
    assert process.returncode == 143, output  # its function not yet called: the signal, not the run, ended it
    assert_nothing_left(marker, 60)


LIBRARY_CALLER = """
import hybridflow

try:
    hybridflow.run("pipeline.yaml")
except hybridflow.InterruptedRun as exc:
    print("raised", type(exc).__name__, int(exc.exit_code), flush=True)
print("the caller goes on", flush=True)
"""


def test_a_library_caller_gets_the_error_raised_not_its_process_ended(project):
    """hybridflow.run from Python, stopped while its stage is in one long native call: the run is
    ended around the stage (recorded, nothing published, no process left) while the call still
    runs, and the caller gets InterruptedRun once it returns; its process is never ended for it."""
    import os
    import sqlite3
    import subprocess
    import sys
    import time
    import uuid

    from hybridflow.execution.stopping import STUCK_AFTER

    held = project.root / "held.db"  # the stage's native call lasts exactly as long as the test holds this
    pipeline(project, "python", "blocked_in_one_native_call", f", params: {{held: '{held}'}}")
    project.write("caller.py", LIBRARY_CALLER)
    holder = sqlite3.connect(held, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    marker = uuid.uuid4().hex
    process = subprocess.Popen([sys.executable, "caller.py"], cwd=project.root, text=True,
                               env={**os.environ, "HYBRIDFLOW_TEST_RUN": marker},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(stage_waiting(project), "the stage to start its native call", process, seconds=120)
        wait_for(lambda: sleeps_in_the_kernel(process.pid), "the stage to wait inside SQLite", process, seconds=60)
        process.send_signal(signal.SIGTERM)
        workdir = project.root / ".hybridflow"
        wait_for(lambda: last_run_record(workdir)[0]["status"] != "running",
                 "the run to be recorded as ended while the call still runs", process, seconds=60)
        run, stages = last_run_record(workdir)
        assert run["status"] == "interrupted" and stages["work"]["status"] == "failed", (run, stages)
        # a second stop request while the call still runs ends nothing twice (the run is over already)
        process.send_signal(signal.SIGTERM)
        time.sleep(STUCK_AFTER + 2)
        assert process.poll() is None, "the caller's process was ended while its stage's call still ran"
        assert last_run_record(workdir) == (run, stages)  # not recorded again, by either thread
    finally:
        holder.rollback()  # the call returns
        holder.close()
    output = finish(process, 90, "the caller after its stage's native call returned")
    assert process.returncode == 0, output
    assert "raised InterruptedRun 143" in output and output.rstrip().endswith("the caller goes on"), output
    assert_nothing_left(marker, 60)
    assert not (project.home("stopping") / "datasets" / "out").exists()  # nothing published
    assert last_run_record(workdir) == (run, stages)  # nor when the call returned and the stage's function ended


def sleeps_in_the_kernel(pid: int) -> bool:
    """The process's main thread sleeps in a nanosleep (SQLite's busy handler does, between tries)."""
    try:
        return "nanosleep" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False
