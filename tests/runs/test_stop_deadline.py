"""A run asked to stop always ends: when what holds it is not a stage (those are cancelled, then
ended around: tests/engines/test_stopping.py) but the run's own cleanup, such as an engine whose stop
waits forever, the CLI's process is ended past a deadline, with the run recorded as interrupted and
every thread's stack written to the run's logs, so what held it can be found."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.projects import last_run_record

ROOT = Path(__file__).resolve().parents[2]

# hybridflow's CLI in this process, with one more engine: the tests' pyarrow engine whose stop never returns
DRIVER = '''
import dataclasses
import sys
import threading

import hybridflow.cli
from hybridflow import engines
from hybridflow.execution import enginepool
from tests.plugin import arrow_tables

enginepool.STOP_WAIT = 1.0  # short bounds: this engine's stop would outlast any
enginepool.RECORD_MARGIN = 2.0


class NeverStops(arrow_tables.ArrowBackend):
    name = "neverstops"

    def stop(self):
        threading.Event().wait()  # what it waits for never comes


def create(settings, log_dir):
    return NeverStops(settings)


engines.register(dataclasses.replace(arrow_tables.ENGINE, name="neverstops", module="__main__"))
sys.argv = ["hybridflow", *sys.argv[1:]]
hybridflow.cli.main()
'''

STAGES = '''
import time

import pyarrow as pa


def wait(events):
    time.sleep(600)
    return pa.table({"x": [1], "day": [1]})
'''


COMMANDS = {"run": ["run", "pipeline.yaml"], "backfill": ["backfill", "pipeline.yaml", "--partitions", "day=1..2"]}


@pytest.mark.parametrize("command", list(COMMANDS.values()), ids=list(COMMANDS))
def test_a_run_whose_engine_never_stops_is_ended_past_its_deadline_and_recorded(project, command):
    import pyarrow as pa
    import pyarrow.parquet as pq

    project.stages(STAGES)
    for day in (1, 2):
        (project.root / "events" / f"day={day}").mkdir(parents=True)
        pq.write_table(pa.table({"n": [day]}), project.root / "events" / f"day={day}" / "part-0.parquet")
    project.pipeline("""
        name: held
        datasets:
          events: {path: events, partition_by: [day], schema: {n: int64, day: int64}}
          x: {partition_by: [day]}
        stages:
          waits: {run: 'mypkg.steps:wait', backend: neverstops, inputs: [events], outputs: [x], incremental: true}
        """)
    project.write("driver.py", DRIVER)
    run = subprocess.Popen([sys.executable, "driver.py", *command], cwd=project.root, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        home = project.home("held")
        deadline = time.monotonic() + 60
        while not list(home.glob("runs/*/logs/waits.log")):
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the stage did not start within 60 s"
            time.sleep(0.1)
        time.sleep(0.5)  # into its sleep
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, (out, err)
    record, stages = last_run_record(project.root / ".hybridflow")
    assert record["status"] == "interrupted" and stages["waits"]["status"] == "failed", (record, stages)
    [stacks] = home.glob(f"runs/{record['run_id']}/logs/stop-stacks.log")
    assert "in stop" in stacks.read_text()  # NeverStops.stop's frame: what held the run
    assert f"every thread's stack is in {stacks}" in err
    assert "run interrupted by SIGINT" in out + err
