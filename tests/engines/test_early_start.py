"""Engines start early: as soon as the plan is known, in the background, while earlier stages
compute; a stage waits only for its own engine, a skipped stage starts nothing, and a start that
fails fails the stage that needs the engine, after the stages before it ran."""

from __future__ import annotations

import os
import time

import pytest

from hybridflow.data.tables import read_arrow
from hybridflow.definition.config import load_pipeline
from hybridflow.errors import ExitCode
from hybridflow.execution.enginepool import BACKGROUND_NICENESS
from hybridflow.execution.runner import Runner
from hybridflow.reporting.timeline import CALL, ENGINE_START, ENGINE_STOP
from hybridflow.results import RunOptions
from hybridflow.store.catalog import Catalog
from hybridflow.store.state import RunStore
from tests.support.engines import child_pids

STAGES = '''
import os
import time
import pandas as pd


def slow():
    waited_for = os.environ.get("HF_TEST_ENGINE_STARTED")  # "<runs.db> <engine>": until its start is recorded
    if waited_for:
        import sqlite3

        database, engine = waited_for.split()
        deadline = time.monotonic() + 120  # an engine started only once this stage ended never comes
        while time.monotonic() < deadline:
            with sqlite3.connect(database) as db:
                if db.execute("SELECT 1 FROM spans WHERE kind = 'engine start' AND detail = ?", [engine]).fetchone():
                    break
            time.sleep(0.1)
    else:
        time.sleep(4)
    return pd.DataFrame({"id": [1, 2, 3], "stage_nice": os.nice(0), "stage_policy": os.sched_getscheduler(0)})


def total(numbers):
    # where this runs: a worker of the engine that started in the background
    return numbers.assign(id=numbers["id"] * 2).map_partitions(
        lambda part: part.assign(worker_nice=os.nice(0), worker_policy=os.sched_getscheduler(0)))
'''

PIPELINE = '''
name: early
backends:
  dask: {n_workers: 1, threads_per_worker: 1}
  spark: {master: "local[1]", conf: {spark.driver.memory: "%s"}}
stages:
  slow: {run: "mypkg.steps:slow", outputs: [numbers]}
  total: {run: "mypkg.steps:total", backend: %s, inputs: [numbers], outputs: [doubled]}
'''


def spans(project, run_id: str) -> list[dict]:
    return RunStore(project.root / ".hybridflow" / "runs.db").spans(run_id)


def test_an_engine_starts_while_the_stages_before_it_compute(project, monkeypatch):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE % ("1g", "dask"))
    # the stage before it lasts until dask's start is recorded: however slow the machine, the start
    # is seen ending while that stage computes, or never (an engine started once its stage comes)
    monkeypatch.setenv("HF_TEST_ENGINE_STARTED", f"{project.root / '.hybridflow' / 'runs.db'} dask")
    before = child_pids()
    result = Runner(load_pipeline(path)).run()
    assert result.status == "success", result.error
    recorded = spans(project, result.run_id)
    start = next(s for s in recorded if s["kind"] == ENGINE_START and s["detail"] == "dask")
    slow = next(s for s in recorded if s["kind"] == CALL and s["stage"] == "slow")
    assert start["started_at"] < slow["ended_at"] and start["ended_at"] < slow["ended_at"], (start, slow)
    # the engine started behind the running stage got a lower CPU priority; the stage kept its own
    [niceness] = read_arrow(Catalog(project.home("early")).current("doubled").source()).to_pylist()[:1]
    assert niceness["stage_nice"] == os.nice(0) and niceness["worker_nice"] == max(os.nice(0), BACKGROUND_NICENESS)
    assert niceness["stage_policy"] == os.sched_getscheduler(0) != os.SCHED_IDLE
    assert niceness["worker_policy"] == os.SCHED_IDLE
    deadline = time.monotonic() + 60
    while child_pids() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not child_pids() - before  # the engine started early is stopped with the run

    again = Runner(load_pipeline(path)).run()  # nothing changed: every stage skips, no engine starts
    assert {s.status for s in again.stages.values()} == {"skipped"}
    assert not [s for s in spans(project, again.run_id) if s["kind"] == ENGINE_START]


def test_an_engine_that_cannot_start_fails_the_stage_that_needs_it(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE % ("not-a-size", "spark"))
    result = Runner(load_pipeline(path)).run()
    assert result.stages["slow"].status == "done"  # the stage before it is not held up by the failure
    assert result.stages["total"].status == "failed"
    assert result.error.exit_code == ExitCode.UNAVAILABLE
    assert "spark" in result.error.one_line()


KEPT_OR_STOPPED = '''
import os
import time
from pathlib import Path

import pandas as pd


def numbers():
    import dask.dataframe as dd

    return dd.from_pandas(pd.DataFrame({"id": [1, 2, 3]}), npartitions=1)


def engine_processes(numbers):
    return pd.DataFrame({"processes": [len(run_processes())]})


def broken():
    raise ValueError("no numbers today")


def processes_once_settled():
    """The most processes the run had while this stage ran (an engine starting in the background),
    and how many were left once they were gone or 30 s later."""
    most, deadline = 0, time.monotonic() + 30
    while (count := len(run_processes())) or not most:
        most = max(most, count)
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return pd.DataFrame({"most": [most], "left": [count]})


def run_processes():
    """The processes below this one (the run's) while this in-process stage runs."""
    parents = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"resource_tracker" not in (entry / "cmdline").read_bytes():
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    found, todo = set(), [os.getpid()]
    while todo:
        parent = todo.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in found]
        found.update(children)
        todo.extend(children)
    return found


def again(numbers, counted):
    return numbers


def passed_on(numbers):
    return numbers
'''

KEPT_OR_STOPPED_PIPELINE = '''
name: early-stop
backends:
  dask: {n_workers: 1, threads_per_worker: 1}
stages:
  make: {run: "mypkg.steps:numbers", backend: dask, outputs: [numbers]}
  count: {run: "mypkg.steps:engine_processes", inputs: [numbers], outputs: [counted]}
'''


@pytest.mark.parametrize("needed_again", [False, True])
def test_an_engine_no_later_stage_needs_is_gone_when_the_next_stage_runs(project, needed_again):
    project.stages(KEPT_OR_STOPPED)
    yaml = KEPT_OR_STOPPED_PIPELINE
    if needed_again:
        yaml += '  again: {run: "mypkg.steps:again", backend: dask, inputs: [numbers, counted], outputs: [last]}\n'
    result = Runner(load_pipeline(project.pipeline(yaml))).run()
    assert result.status == "success", result.error
    [counted] = read_arrow(Catalog(project.home("early-stop")).current("counted").source()).to_pylist()
    # a local Dask cluster is at least its worker's process: stopped before `count` ran, unless
    # `again` needs it after
    assert (counted["processes"] > 0) == needed_again, counted


GIVEN_UP_PIPELINE = '''
name: given-up
backends:
  dask: {n_workers: 1, threads_per_worker: 1}
stages:
  make: {run: "mypkg.steps:broken", outputs: [numbers]}
  use: {run: "mypkg.steps:passed_on", backend: dask, inputs: [numbers], outputs: [last]}
  count: {run: "mypkg.steps:processes_once_settled", outputs: [counted]}
'''


def test_an_engine_started_early_for_a_stage_a_failure_blocked_is_stopped_while_the_run_goes_on(project):
    project.stages(KEPT_OR_STOPPED)
    result = Runner(load_pipeline(project.pipeline(GIVEN_UP_PIPELINE)), RunOptions(keep_going=True)).run()
    assert [result.stages[s].status for s in ("make", "use", "count")] == ["failed", "not run", "done"]
    recorded = spans(project, result.run_id)
    assert "dask" in [s["detail"] for s in recorded if s["kind"] == ENGINE_START]  # started early, for `use`
    [counted] = read_arrow(Catalog(project.home("given-up")).current("counted").source()).to_pylist()
    # seen starting, then stopped once up, while `count` ran, not at the end of the run
    assert counted["most"] > 0 and counted["left"] == 0, counted
    stop = next(s for s in recorded if s["kind"] == ENGINE_STOP and s["detail"] == "dask")
    count = next(s for s in recorded if s["kind"] == CALL and s["stage"] == "count")
    assert stop["started_at"] < count["ended_at"], (stop, count)


STARVING = '''
import os
import subprocess
import sys

import pandas as pd
import polars as pl

BURN = "import time\\nend = time.monotonic() + %s\\nwhile time.monotonic() < end:\\n    pass\\n"


def burn(seconds):
    """Every core busy at the stage's own priority for `seconds`: the engines starting behind it starve."""
    burners = [subprocess.Popen([sys.executable, "-c", BURN % seconds]) for _ in range(os.cpu_count() or 2)]
    for burner in burners:
        burner.wait()
    return pd.DataFrame({"id": [1, 2, 3]})


def on_spark(seed):
    return seed.withColumn("twice", seed["id"] * 2)


def on_dask(seed):
    return seed.assign(twice=seed["id"] * 2)


def on_ray(seed):
    return seed.map_batches(lambda batch: batch.assign(twice=batch["id"] * 2), batch_format="pandas")


def on_polars(seed):
    return seed.with_columns(twice=pl.col("id") * 2)
'''

STARVING_PIPELINE = '''
name: starving
backends:
  dask: {n_workers: 1, threads_per_worker: 1}
  spark: {master: "local[1]"}
  ray: {num_cpus: 1}
stages:
  burn: {run: "mypkg.steps:burn", params: {seconds: 90}, outputs: [seed]}
  spark_stage: {run: "mypkg.steps:on_spark", backend: spark, inputs: [seed], outputs: [by_spark]}
  dask_stage: {run: "mypkg.steps:on_dask", backend: dask, inputs: [seed], outputs: [by_dask]}
  ray_stage: {run: "mypkg.steps:on_ray", backend: ray, inputs: [seed], outputs: [by_ray]}
  polars_stage: {run: "mypkg.steps:on_polars", backend: polars, inputs: [seed], outputs: [by_polars]}
'''


def test_engines_started_behind_a_stage_that_keeps_every_core_busy_for_minutes_still_serve_their_stages(project):
    """An early start is an optimisation, never fatal: 90 s of every core busy before each engine's
    first stage (Ray's own start gives up after 30 s without its raylet registering)."""
    project.stages(STARVING)
    result = Runner(load_pipeline(project.pipeline(STARVING_PIPELINE))).run()
    assert result.status == "success", result.error and result.error.one_line()
    recorded = spans(project, result.run_id)
    burn = next(s for s in recorded if s["kind"] == CALL and s["stage"] == "burn")
    started = {s["detail"] for s in recorded if s["kind"] == ENGINE_START and s["started_at"] < burn["ended_at"]}
    assert {"spark", "dask", "ray"} <= started  # each began its start behind the burning stage
    catalog = Catalog(project.home("starving"))
    for name in ("by_spark", "by_dask", "by_ray", "by_polars"):
        rows = sorted(read_arrow(catalog.current(name).source()).to_pylist(), key=lambda row: row["id"])
        assert rows == [{"id": i, "twice": 2 * i} for i in (1, 2, 3)], (name, rows)
