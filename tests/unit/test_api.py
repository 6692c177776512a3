"""The Python API is the CLI's engine room: a run through hybridflow.run gives the same published
outputs and run records as `hybridflow run`, errors raise the typed exceptions the CLI maps to exit
codes, read() returns what a python stage would get, and the "From Python" guide's example runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import hybridflow
from hybridflow.store.catalog import Catalog

ROOT = Path(__file__).resolve().parents[2]

STAGES = '''
import pandas as pd


def make(n):
    return pd.DataFrame({"x": list(range(n)), "y": [i * 0.5 for i in range(n)]})


def double(made, ctx):
    ctx.log.info("doubling")
    return made.assign(x=made.x * 2)


def broken(made):
    raise ValueError("broken on purpose")
'''

PIPELINE = '''
name: api
params: {n: 4}
stages:
  make: {run: "mypkg.steps:make", outputs: [made]}
  double: {run: "mypkg.steps:double", inputs: [made], outputs: [doubled]}
'''


def published(project, name: str) -> dict[str, tuple[str, ...]]:
    """Each dataset's current content digest and file names: what two equal runs both publish."""
    catalog = Catalog(project.home(name))
    versions = {ds: catalog.current(ds) for ds in catalog.datasets()}
    return {ds: (v.manifest.get("data"), tuple(f["path"] for f in v.manifest["files"])) for ds, v in versions.items()}


def comparable(run: dict) -> dict:
    return {k: run[k] for k in ("pipeline", "status", "trigger", "arguments", "error")}


def test_the_api_and_the_cli_publish_the_same_outputs_and_records(project, tmp_path):
    project.stages(STAGES)
    project.pipeline(PIPELINE)
    other = tmp_path / "copy"
    shutil.copytree(project.root, other)

    result = hybridflow.run(project.root / "pipeline.yaml", params={"n": 6}, force=True)
    assert result.ok and result.exit_code == 0 and result.status == "success"
    assert [s.status for s in result.stages.values()] == ["done", "done"]
    assert result.stages["double"].rows_out == 6 and set(result.stages["double"].outputs) == {"doubled"}

    cli = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml", "--param", "n=6",
                          "--force"], cwd=other, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    from tests.support.projects import Project

    assert published(project, "api") == published(Project(other), "api")
    [api_run] = hybridflow.runs(project.root / "pipeline.yaml", stages=True)
    [cli_run] = hybridflow.runs(other / "pipeline.yaml", stages=True)
    assert comparable(api_run) == comparable(cli_run)
    assert [(s["stage"], s["status"], s["rows_out"]) for s in api_run["stages"]] == \
        [(s["stage"], s["status"], s["rows_out"]) for s in cli_run["stages"]]


def test_read_gives_a_python_stages_frame_and_plan_says_everything_is_up_to_date(project):
    project.stages(STAGES)
    pipeline = hybridflow.load(project.pipeline(PIPELINE))
    hybridflow.run(pipeline).raise_for_status()
    frame = hybridflow.read(pipeline, "doubled")
    pd.testing.assert_frame_equal(frame, pd.DataFrame({"x": [0, 2, 4, 6], "y": [0.0, 0.5, 1.0, 1.5]}))
    assert hybridflow.read(pipeline, "doubled", engine="arrow").num_rows == 4
    assert hybridflow.read(pipeline, "doubled", engine="path").is_dir()
    assert hybridflow.plan(pipeline).to_run == []
    assert hybridflow.plan(pipeline, force=["double"]).to_run == ["double"]
    again = hybridflow.run(pipeline)
    assert [s.status for s in again.stages.values()] == ["skipped", "skipped"]


def test_errors_are_typed_with_the_clis_exit_codes(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    with pytest.raises(hybridflow.UsageError, match="no stage named 'dubble'"):
        hybridflow.run(path, force=["dubble"])
    with pytest.raises(hybridflow.UsageError, match="no published version"):
        hybridflow.read(path, "doubled")
    bad = project.pipeline("name: bad\nstages:\n  a: {run: 'mypkg.steps:make', backend: sparkk}\n", "bad.yaml")
    with pytest.raises(hybridflow.ConfigError) as caught:
        hybridflow.load(bad)
    assert caught.value.exit_code == 78 and "bad.yaml:3" in caught.value.one_line()


def test_a_failed_stage_is_in_the_result_and_resume_repeats_the_run(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE.replace("mypkg.steps:double", "mypkg.steps:broken"))
    result = hybridflow.run(path)
    assert result.status == "failed" and result.exit_code == 1
    assert "broken on purpose" in result.stages["double"].error
    with pytest.raises(hybridflow.StageError):
        result.raise_for_status()
    project.pipeline(PIPELINE)  # fixed
    resumed = hybridflow.run(path, resume=True)
    assert resumed.ok and resumed.stages["make"].status == "skipped"
    assert hybridflow.run(path, resume=True) is None  # the last run succeeded: nothing to resume


def test_the_from_python_guides_example_runs(tmp_path):
    guide = (ROOT / "docs" / "guides" / "python.md").read_text()
    [example] = re.findall(r"```python\n(.*?)```", guide, re.S)
    for part in ("configs", "stages", "data"):
        shutil.copytree(ROOT / part, tmp_path / part)
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "weekly done" in done.stdout and "success" in done.stdout


def test_a_loaded_pipelines_params_are_recorded_as_the_cli_records_them(project):
    import json

    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    result = hybridflow.run(hybridflow.load(path, params={"n": 6}))
    assert result.stages["double"].rows_out == 6
    [run] = hybridflow.runs(path)
    assert json.loads(run["arguments"])["params"] == ["n=6"]  # what --resume repeats
    with pytest.raises(hybridflow.UsageError):
        hybridflow.collect_garbage(path, keep=0)


def test_every_command_of_the_cli_is_a_function_of_the_api(project, tmp_path, fake_crontab):
    """validate, graph, schema, show, logs, doctor, init and schedule: what each CLI command prints
    comes from one API call, so a notebook or another scheduler gets the same answers."""
    from tests.support.crontabs import TINY_STAGES, tiny_pipeline

    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    broken = project.pipeline(PIPELINE.replace("inputs: [made]", "inputs: [nowhere]"), "broken.yaml")
    files, problems = hybridflow.validate([project.root])
    assert set(files) == {path, broken}
    assert {Path(p.file).name for p in problems if p.severity == "error"} == {"broken.yaml"}
    assert "make" in hybridflow.graph(path) and "double" in hybridflow.graph(path)
    assert hybridflow.graph(path, "dot").startswith("digraph")
    assert "backends" in hybridflow.schema()["properties"]

    with pytest.raises(hybridflow.UsageError, match=re.escape(f"no run records in {project.root / '.hybridflow'}")):
        hybridflow.run_record("last", path)  # the pipeline's own workdir is named, not the default
    result = hybridflow.run(path)
    record = hybridflow.run_record("last", path)
    assert record["run_id"] == result.run_id and [s["stage"] for s in record["stages"]] == ["make", "double"]
    assert any(span["kind"] for span in record["spans"])
    [(stage, log)] = hybridflow.stage_logs(record["run_id"][:12], path, stage="double")
    assert stage == "double" and "doubling" in log.read_text()
    with pytest.raises(hybridflow.UsageError, match=r"has no log for stage 'dubble' \(did you mean 'double'\?\)"):
        hybridflow.stage_logs("last", path, stage="dubble")
    with pytest.raises(hybridflow.UsageError, match="no run records in"):
        hybridflow.runs(workdir=tmp_path / "nowhere", missing_ok=False)

    checks = {f.check: f.status for f in hybridflow.diagnose(path)}
    assert checks["workdir"] == "ok" and "java" not in checks  # a python-only pipeline needs no Java
    written = hybridflow.init(tmp_path / "fresh")
    assert tmp_path / "fresh" / "pipeline.yaml" in written

    project.stages(TINY_STAGES)
    scheduled = project.pipeline(tiny_pipeline("0 3 * * 1", "UTC"), "tiny.yaml")
    entry = hybridflow.install_schedule(scheduled)
    [(listed, upcoming)] = hybridflow.schedules()
    assert (listed.pipeline, listed.cron, len(upcoming)) == ("tiny", "0 3 * * 1", 2)
    assert all(t.weekday() == 0 and t.hour == 3 for t in upcoming)
    assert hybridflow.remove_schedule("tiny").file == entry.file and hybridflow.schedules() == []
    assert hybridflow.is_due(scheduled) in (True, False)
