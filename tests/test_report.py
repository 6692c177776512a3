"""A run's wall-clock timeline is recorded in runs.db (engine starts and stops; each attempt's input
read, function, publish and retry waits), and `hybridflow report` turns a run into one self-contained
HTML file: a timeline, every stage with why it ran or was skipped, and nothing fetched from elsewhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hybridflow.state import RunStore

STAGES = '''
from pathlib import Path

import pandas as pd


def make():
    return pd.DataFrame({"x": [1, 2, 3]})


def flaky(made):
    marker = Path("tried")  # in the project directory, where the run was started
    if not marker.exists():  # fails on its first attempt only
        marker.write_text("once")
        raise RuntimeError("first attempt fails")
    return made.assign(y=made.x * 2)
'''

PIPELINE = '''
name: timed
stages:
  make: {run: "mypkg.steps:make", outputs: [made]}
  flaky: {run: "mypkg.steps:flaky", inputs: [made], outputs: [doubled], retries: 1, retry_delay: 0.2}
'''


def cli(project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], cwd=project.root, capture_output=True,
                          text=True, timeout=120)


def test_the_timeline_is_recorded_and_reported_in_one_self_contained_file(project):
    project.stages(STAGES)
    project.pipeline(PIPELINE)
    assert cli(project, "run", "pipeline.yaml").returncode == 0
    store = RunStore(project.root / ".hybridflow" / "runs.db")
    [run] = store.runs()
    spans = store.spans(run["run_id"])
    steps = [(s["stage"], s["kind"], s["attempt"], s["outcome"]) for s in spans if s["kind"] != "attempt"]
    assert ("flaky", "function", 1, "failed") in steps and ("flaky", "retry wait", 1, "ok") in steps
    assert ("flaky", "function", 2, "ok") in steps and ("flaky", "publish", 2, "ok") in steps
    assert ("make", "read inputs", 1, "ok") in steps
    assert all(s["ended_at"] >= s["started_at"] for s in spans)
    flaky = [s for s in spans if s["stage"] == "flaky"]
    assert min(s["started_at"] for s in flaky) >= max(s["ended_at"] for s in spans if s["stage"] == "make")

    assert cli(project, "run", "pipeline.yaml").returncode == 0  # every stage skipped this time
    shown = cli(project, "report", "--pipeline", "pipeline.yaml")
    assert shown.returncode == 0, shown.stderr
    path = project.root / shown.stdout.strip()
    html = path.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html
    assert "skipped" in html and "unchanged" in html  # why the second run skipped them
    for reference in ("http://", "https://", "<script src", "<link"):
        assert reference not in html  # opens offline: from cron's folder, a mail, a CI artifact

    first = cli(project, "report", run["run_id"], "--pipeline", "pipeline.yaml", "--out", "first.html")
    assert first.returncode == 0, first.stderr
    html = (project.root / "first.html").read_text()
    assert html.count("<rect") >= len(spans)  # a bar per recorded step, and the legend
    assert "first attempt fails" in html  # the tail of the stage's log
    assert "doubled" in html and "x: int64" in html and "made@" in html  # dataset, schema, lineage
    assert (Path(run["run_dir"]) / "report.html").is_file()  # every run writes its own report
    assert "No earlier successful run" in html and "Compared with" in path.read_text()


EARLY = '''
import os
from pathlib import Path

import pandas as pd


def on_dask():
    import dask.dataframe as dd

    return dd.from_pandas(pd.DataFrame({"x": [1, 2]}), npartitions=1)


def afterwards(made):
    me = str(os.getpid())
    workers = []
    for entry in Path("/proc").glob("[0-9]*"):  # Dask's worker processes are this process's children
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == me and \\
                    b"spawn_main" in (entry / "cmdline").read_bytes():
                workers.append(entry.name)
        except (OSError, IndexError):
            continue
    return made.assign(workers_alive=len(workers))
'''


def test_an_engine_no_later_stage_needs_is_stopped_before_the_next_stage(project):
    project.stages(EARLY)
    project.pipeline('''
    name: early
    backends: {dask: {n_workers: 1, threads_per_worker: 1}}
    stages:
      made: {run: "mypkg.steps:on_dask", backend: dask, outputs: [made]}
      after: {run: "mypkg.steps:afterwards", inputs: [made], outputs: [checked]}
    ''')
    assert cli(project, "run", "pipeline.yaml").returncode == 0
    import pyarrow.parquet as pq

    from hybridflow.catalog import Catalog

    checked = Catalog(project.home("early")).current("checked")
    assert pq.read_table([str(f) for f in checked.files])["workers_alive"].to_pylist() == [0, 0]
    store = RunStore(project.root / ".hybridflow" / "runs.db")
    [run] = store.runs()
    spans = store.spans(run["run_id"])
    stopped = [s for s in spans if s["kind"] == "engine stop" and s["detail"] == "dask"]
    called = [s for s in spans if s["kind"] == "function" and s["stage"] == "after"]
    assert stopped and called and stopped[0]["ended_at"] <= called[0]["started_at"]
