"""Stops that must work whatever the stage is blocked in: a Ray stage waiting in ray.get on a task or
an actor call that sleeps for an hour is stopped by its timeout, SIGTERM and SIGINT within seconds;
SIGTERM while Spark is still starting leaves no JVM behind. Every run exits with its documented code,
is recorded, and leaves no engine process."""

from __future__ import annotations

import signal

import pytest

from .conftest import last_run_record
from .engines import assert_nothing_left
from .test_faults import start, wait_for
from .test_three_engines import finish

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


@pytest.mark.parametrize("function", ["waits_on_task", "waits_on_actor"])
@pytest.mark.parametrize("stop, code", [("timeout", 124), (signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["timeout", "sigterm", "sigint"])
def test_a_ray_stage_blocked_in_ray_get_is_stopped(project, function, stop, code):
    pipeline(project, "ray", function, ", timeout: 5" if stop == "timeout" else "")
    process, marker = start(project)
    wait_for(stage_waiting(project), "the stage to wait in ray.get", process, seconds=300)
    if stop != "timeout":
        process.send_signal(stop)
    # a run that waited for its hour-long task would blow through this; Ray's own GCS timeout is 60 s
    output = finish(process, 50, f"the run after {stop} (its task sleeps for an hour)")
    assert process.returncode == code, output
    assert_nothing_left(marker, 60)
    run, stages = last_run_record(project.root / ".hybridflow")
    assert run["status"] == ("failed" if stop == "timeout" else "interrupted")
    assert stages["work"]["status"] == "failed"
    assert not (project.home("stopping") / "datasets" / "out").exists()  # nothing published


@pytest.mark.parametrize("delay", [2.0, 3.5, 5.0])
def test_sigterm_while_spark_starts_leaves_no_jvm(project, delay):
    import time

    pipeline(project, "spark", "spark_etl")
    process, marker = start(project)
    time.sleep(delay)  # somewhere in start-up: importing pyspark, launching or connecting to the JVM
    process.send_signal(signal.SIGTERM)
    output = finish(process, 120, "the run after SIGTERM")
    assert process.returncode in (0, 143), output  # 0 only if the whole run beat the signal
    assert_nothing_left(marker, 60)
