"""Run records in SQLite, and the commands that read them: runs, show, logs."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from hybridflow.cli import app
from hybridflow.definition.config import load_pipeline
from hybridflow.errors import ExitCode
from hybridflow.execution.runner import Runner
from hybridflow.results import RunOptions
from hybridflow.store.state import RunStore
from tests.unit.test_cli import STEPS, STEPS_PIPELINE
from tests.unit.test_runner import PIPELINE, STAGES

cli = CliRunner()


def test_every_run_and_stage_is_recorded_with_lineage(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    first = Runner(load_pipeline(path)).run()
    bad = project.pipeline(PIPELINE.replace("mypkg.steps:sink", "mypkg.steps:boom").replace("[doubled]", "[numbers]"),
                           "bad.yaml")
    failed = Runner(load_pipeline(bad), RunOptions(trigger="cron")).run()
    store = RunStore(project.root / ".hybridflow" / "runs.db")
    runs = store.runs("demo")
    assert [r["run_id"] for r in runs] == [failed.run_id, first.run_id]  # newest first
    assert runs[0]["status"] == "failed" and runs[0]["trigger"] == "cron"
    assert runs[0]["error"].startswith("ValueError: the data is bad")
    assert runs[1]["status"] == "success" and runs[1]["ended_at"] >= runs[1]["started_at"]
    stages = {s["stage"]: s for s in store.stages(first.run_id)}
    assert stages["make"]["rows_out"] == 5 and stages["double"]["rows_in"] == 4
    assert stages["double"]["bytes_in"] > 0 and stages["sink"]["status"] == "done"
    assert stages["make"]["log_path"].endswith("make.log")
    assert store.run(first.run_id)["status"] == "success"
    assert store.run(first.run_id[:-2])["run_id"] == first.run_id  # a unique prefix is enough
    assert store.run("2") is None  # ambiguous: both runs start with it


def test_runs_show_and_logs_commands(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    result = Runner(load_pipeline(path)).run()
    workdir = str(project.root / ".hybridflow")
    listed = cli.invoke(app, ["runs", str(path)], terminal_width=200)
    assert listed.exit_code == 0 and result.run_id in listed.output and "success" in listed.output
    shown = cli.invoke(app, ["show", result.run_id, "--workdir", workdir], terminal_width=250)
    assert shown.exit_code == 0, shown.output
    assert "double" in shown.output and "published" in shown.output
    assert "overhead" in shown.output and "publish" in shown.output and "ms" in shown.output  # where time went
    assert f"numbers@{result.stages['make'].outputs['numbers']}" in shown.output  # lineage of 'doubled'
    assert re.search(r"numbers@\S+ \(1 file, median \d+(\.\d+)? ?[kK]?B\)", shown.output), shown.output
    logs = cli.invoke(app, ["logs", result.run_id, "make", "--pipeline", str(path)])
    assert logs.exit_code == 0 and "hello from make" in logs.output
    every = cli.invoke(app, ["logs", result.run_id, "--workdir", workdir])
    assert "==> make" in every.output and "==> sink" in every.output
    unknown = cli.invoke(app, ["show", "20000101", "--workdir", workdir])
    assert unknown.exit_code == ExitCode.USAGE and "no single run matches '20000101'" in unknown.output
    typo = cli.invoke(app, ["logs", result.run_id, "mkae", "--workdir", workdir])
    assert typo.exit_code == ExitCode.USAGE and "did you mean 'make'" in typo.output
    empty = cli.invoke(app, ["runs", "--workdir", str(project.root / "nowhere")])
    assert empty.exit_code == ExitCode.USAGE and "no run records" in empty.output


def test_last_names_the_newest_run_for_show_and_logs(project):
    project.stages(STEPS)
    path = project.pipeline(STEPS_PIPELINE)
    other = project.pipeline(STEPS_PIPELINE.replace("name: demo", "name: other"), "other.yaml")
    first = Runner(load_pipeline(path)).run()
    newest = Runner(load_pipeline(other)).run()
    workdir = str(project.root / ".hybridflow")
    # the workdir's newest run, whichever pipeline made it; with --pipeline, that pipeline's newest
    shown = cli.invoke(app, ["show", "last", "--workdir", workdir], terminal_width=250)
    assert shown.exit_code == 0, shown.output
    assert f"run {newest.run_id}  other" in shown.output
    shown = cli.invoke(app, ["show", "last", "--pipeline", str(path)], terminal_width=250)
    assert shown.exit_code == 0 and f"run {first.run_id}  demo" in shown.output, shown.output
    logs = cli.invoke(app, ["logs", "last", "make", "--pipeline", str(path)])
    assert logs.exit_code == 0 and "hello from make" in logs.output, logs.output
    every = cli.invoke(app, ["logs", "last", "--workdir", workdir])
    assert every.exit_code == 0 and "==> make" in every.output and newest.run_id in every.output, every.output
    never = project.pipeline(STEPS_PIPELINE.replace("name: demo", "name: never"), "never.yaml")
    none = cli.invoke(app, ["show", "last", "--pipeline", str(never)])
    assert none.exit_code == ExitCode.USAGE and "no run of never is recorded" in none.output, none.output


def test_runs_lists_each_run_with_its_duration(project):
    from datetime import datetime, timedelta, timezone

    store = RunStore(project.root / ".hybridflow" / "runs.db")
    start = datetime(2026, 11, 23, 3, 0, tzinfo=timezone.utc)
    for run_id, seconds, status in (("20261123T030000Z-aaaaaa", 51.94, "success"),
                                    ("20261123T040000Z-bbbbbb", 192.4, "failed"),
                                    ("20261123T050000Z-cccccc", 7384, "success"),
                                    ("20261123T060000Z-dddddd", None, "killed")):
        started = start.replace(hour=int(run_id[9:11]))
        store.save_run(run_id=run_id, pipeline="demo", trigger="cron", status=status,
                       started_at=started.isoformat(timespec="milliseconds"),
                       ended_at=(started + timedelta(seconds=seconds or 1)).isoformat(timespec="milliseconds"))
    listed = cli.invoke(app, ["runs", "--workdir", str(project.root / ".hybridflow")], terminal_width=200)
    assert listed.exit_code == 0, listed.output
    assert "duration" in listed.output.splitlines()[1]
    rows = {line.split("│")[1].strip(): line.split("│")[5].strip() for line in listed.output.splitlines()
            if line.startswith("│")}
    # a killed run's end is when its death was noticed: no duration rather than a wrong one
    assert rows == {"20261123T030000Z-aaaaaa": "51.9s", "20261123T040000Z-bbbbbb": "3m 12s",
                    "20261123T050000Z-cccccc": "2h 03m", "20261123T060000Z-dddddd": ""}, listed.output
