"""Run records in SQLite, and the commands that read them: runs, show, logs."""

from __future__ import annotations

from typer.testing import CliRunner

from hybridflow.cli import app
from hybridflow.config import load_pipeline
from hybridflow.errors import ExitCode
from hybridflow.runner import Runner
from hybridflow.state import RunStore

from .test_runner import PIPELINE, STAGES

cli = CliRunner()


def test_every_run_and_stage_is_recorded_with_lineage(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    first = Runner(load_pipeline(path)).run()
    bad = project.pipeline(PIPELINE.replace("mypkg.steps:sink", "mypkg.steps:boom").replace("[doubled]", "[numbers]"),
                           "bad.yaml")
    failed = Runner(load_pipeline(bad), trigger="cron").run()
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
    assert f"numbers@{result.stages['make'].outputs['numbers']}" in shown.output  # lineage of 'doubled'
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
