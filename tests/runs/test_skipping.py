"""Content-aware skipping, incremental partitions, resume and garbage collection, on the python backend
through the real CLI (a subprocess, so `--force` alone is parsed as users type it)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from hybridflow.data.tables import read_arrow
from hybridflow.store.catalog import Catalog
from hybridflow.store.state import RunStore
from tests.support.projects import last_run_record

STAGES = '''
import pandas as pd

from mypkg import helpers


def make(n):
    return pd.DataFrame({"id": range(n)})


def scale(numbers, factor):
    return numbers.assign(value=numbers["id"] * helpers.weight(factor))


def report(scaled, ctx):
    ctx.log.info("report saw %d rows", len(scaled))
    return pd.DataFrame({"total": [float(scaled["value"].sum())]})


def flaky(scaled, ctx):
    import os
    if os.path.exists(os.environ["HF_FAIL_FILE"]):
        raise RuntimeError("asked to fail")
    return scaled


def keyed(numbers, token):
    return numbers.assign(tag=token[:0] + "t")
'''

PIPELINE = '''
name: demo
params: {n: 4, factor: 2, unused: 1}
stages:
  make: {run: mypkg.steps:make, outputs: [numbers]}
  scale: {run: mypkg.steps:scale, inputs: [numbers], outputs: [scaled]}
  report: {run: mypkg.steps:report, inputs: [scaled], outputs: [summary]}
'''


def hybridflow(project, *args, env=None):
    import os

    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], cwd=project.root, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def setup(project, pipeline=PIPELINE):
    project.stages(STAGES)
    project.write("mypkg/helpers.py", "def weight(factor):\n    return factor * 1.0\n")
    return project.pipeline(pipeline)


def statuses(project) -> dict[str, tuple[str, str]]:
    _, stages = last_run_record(project.root / ".hybridflow")
    return {name: (s["status"], s["skip_reason"]) for name, s in stages.items()}


def plan_rows(output: str) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) == 7 and cells[1].isdigit():
            rows[cells[2]] = (cells[4], cells[5])
    return rows


def test_a_second_run_skips_everything_and_says_why(project):
    setup(project)
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0
    first, _ = last_run_record(project.root / ".hybridflow")
    done = hybridflow(project, "run", "pipeline.yaml")
    assert done.returncode == 0, done.stderr
    assert statuses(project) == {s: ("skipped", f"unchanged since run {first['run_id']}")
                                 for s in ("make", "scale", "report")}
    plan = hybridflow(project, "plan", "pipeline.yaml")
    assert plan.returncode == 0 and "0 of 3 stages to run, 3 up to date" in plan.stdout


def test_plan_names_what_changed(project):
    setup(project)
    hybridflow(project, "run", "pipeline.yaml")
    # a param no function takes changes nothing
    assert "0 of 3 stages to run" in hybridflow(project, "plan", "pipeline.yaml", "-p", "unused=2").stdout
    rows = plan_rows(hybridflow(project, "plan", "pipeline.yaml", "-p", "factor=3").stdout)
    assert rows == {"make": ("skip", rows["make"][1]), "scale": ("run", "params.factor changed 2 -> 3"),
                    "report": ("run", "input scaled will be rebuilt by stage scale")}
    project.write("mypkg/helpers.py", "def weight(factor):\n    return factor * 2.0\n")
    rows = plan_rows(hybridflow(project, "plan", "pipeline.yaml", "--force", "report").stdout)
    # only scale calls helpers.weight: make, in the same module, does not reach it
    assert rows == {"make": ("skip", rows["make"][1]), "scale": ("run", "function weight in mypkg/helpers.py changed"),
                    "report": ("run", "forced")}


def test_a_comment_edit_reruns_nothing_and_a_code_edit_only_the_stages_that_reach_it(project):
    setup(project)
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0
    steps = project.root / "mypkg" / "steps.py"
    steps.write_text('"""Stage functions, now documented."""\n' + STAGES.replace(
        "def report(scaled, ctx):\n", 'def report(scaled, ctx):\n    """Sums the values."""\n    # log first\n')
        + "\n# a trailing comment\n")
    assert "0 of 3 stages to run" in hybridflow(project, "plan", "pipeline.yaml").stdout
    steps.write_text(steps.read_text().replace('"report saw %d rows"', '"report got %d rows"'))
    rows = plan_rows(hybridflow(project, "plan", "pipeline.yaml").stdout)
    assert rows == {"make": ("skip", rows["make"][1]), "scale": ("skip", rows["scale"][1]),
                    "report": ("run", "function report in mypkg/steps.py changed")}
    steps.write_text(steps.read_text().replace("import pandas as pd\n", "import pandas as pd\nLIMIT = 3\n"))
    rows = plan_rows(hybridflow(project, "plan", "pipeline.yaml", "--only", "scale").stdout)
    assert rows == {"scale": ("run", "module-level code in mypkg/steps.py changed")}  # it runs on import


def test_a_fingerprint_of_an_older_version_reruns_the_stage_and_says_why(project):
    setup(project)
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0
    manifest_file = Catalog(project.home("demo")).current("numbers").directory / "_manifest.json"
    manifest_file.chmod(0o644)  # published read-only
    manifest = json.loads(manifest_file.read_text())
    manifest["fingerprint"]["code"] = {"mypkg/steps.py": "0" * 64, "mypkg/helpers.py": "1" * 64}  # per file
    manifest["fingerprint"]["digest"] = manifest["fingerprint"]["base"] = "2" * 64
    manifest_file.write_text(json.dumps(manifest))
    plan = hybridflow(project, "plan", "pipeline.yaml")
    assert plan.returncode == 0, plan.stderr
    assert plan_rows(plan.stdout)["make"] == ("run", "its code was fingerprinted by an older version of hybridflow")


def test_the_engine_wide_gpu_default_is_part_of_the_fingerprint(project):
    setup(project, PIPELINE + "backends: {python: {gpu: false}}\n")
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0
    text = (project.root / "pipeline.yaml").read_text()
    project.pipeline(text.replace("gpu: false", "gpu: auto"))
    rows = plan_rows(hybridflow(project, "plan", "pipeline.yaml").stdout)
    assert rows["make"] == ("run", "settings.gpu changed false -> auto")
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0  # no GPU here: auto runs on the CPU
    assert "0 of 3 stages to run" in hybridflow(project, "plan", "pipeline.yaml").stdout  # and it stays done


def test_the_requested_gpu_mode_comes_from_the_stage_else_its_engine(project):
    from hybridflow.definition.config import load_pipeline
    from hybridflow.execution.planner import Planner
    from hybridflow.store.workspace import Workspace

    project.stages(STAGES)
    path = project.pipeline('''
    name: gpus
    params: {n: 1}
    backends: {dask: {gpu: auto}, spark: {gpu: true}}
    stages:
      default: {run: mypkg.steps:make, backend: dask, outputs: [a]}
      own: {run: mypkg.steps:make, backend: dask, gpu: false, outputs: [b]}
      spark: {run: mypkg.steps:make, backend: spark, outputs: [c]}
      python: {run: mypkg.steps:make, outputs: [d]}
    ''')
    pipeline = load_pipeline(path)
    planner = Planner(pipeline, Workspace.of(pipeline))
    modes = {stage: planner.fingerprint(stage).settings["gpu"] for stage in pipeline.stages}
    assert modes == {"default": "auto", "own": False, "spark": True, "python": False}


def test_a_stage_whose_last_attempt_failed_says_in_which_run(project, tmp_path):
    fail = tmp_path / "fail"
    fail.touch()
    setup(project, PIPELINE + "  flaky: {run: mypkg.steps:flaky, inputs: [scaled], outputs: [checked]}\n")
    env = {"HF_FAIL_FILE": str(fail)}
    assert hybridflow(project, "run", "pipeline.yaml", env=env).returncode == 1
    assert hybridflow(project, "run", "pipeline.yaml", env=env).returncode == 1
    latest, _ = last_run_record(project.root / ".hybridflow")
    assert statuses(project)["flaky"][0] == "failed"
    rows = plan_rows(hybridflow(project, "plan", "pipeline.yaml", env=env).stdout)
    assert rows["flaky"] == ("run", f"failed in run {latest['run_id']}")
    assert hybridflow(project, "run", "pipeline.yaml", "--only", "make", env=env).returncode == 0  # not tried
    fail.unlink()
    assert hybridflow(project, "run", "pipeline.yaml", env=env).returncode == 0
    assert statuses(project)["flaky"] == ("done", f"failed in run {latest['run_id']}")


def test_last_attempt_is_the_newest_run_of_the_pipeline_that_tried_the_stage(tmp_path):
    store = RunStore(tmp_path / "runs.db")

    def record(run_id: str, day: int, pipeline: str = "demo", **stages: str) -> None:
        store.save_run(run_id=run_id, pipeline=pipeline, trigger="manual", started_at=f"2026-01-0{day}T03:00:00",
                       status="failed")
        for position, (stage, status) in enumerate(stages.items()):
            store.save_stage(run_id=run_id, stage=stage, backend="python", status=status, position=position)

    record("r1", 1, make="done", flaky="failed")
    record("r2", 2, make="skipped", flaky="killed")
    record("r3", 3, make="skipped", flaky="not run")  # neither was tried
    record("r4", 4, pipeline="other", make="failed", flaky="done")
    assert store.last_attempt("demo", "flaky") == {"run_id": "r2", "status": "killed"}
    assert store.last_attempt("demo", "make") == {"run_id": "r1", "status": "done"}
    assert store.last_attempt("other", "flaky") == {"run_id": "r4", "status": "done"}
    assert store.last_attempt("demo", "report") is None


def test_an_unchanged_rebuild_upstream_lets_downstream_skip(project):
    setup(project)
    hybridflow(project, "run", "pipeline.yaml")
    done = hybridflow(project, "run", "pipeline.yaml", "--force", "make")
    assert done.returncode == 0, done.stderr
    result = statuses(project)
    assert result["make"] == ("done", "forced")
    assert result["scale"][0] == "skipped"  # make wrote the same bytes: scale's input is unchanged
    done = hybridflow(project, "run", "pipeline.yaml", "-p", "n=5")
    result = statuses(project)
    assert result["make"] == ("done", "params.n changed 4 -> 5")
    assert result["scale"] == ("done", "input numbers has a new version")
    assert result["report"] == ("done", "input scaled has a new version")


def test_bare_force_runs_every_stage(project):
    setup(project)
    hybridflow(project, "run", "pipeline.yaml")
    assert hybridflow(project, "run", "pipeline.yaml", "--force").returncode == 0
    assert {s for s, _ in statuses(project).values()} == {"done"}
    wrong = hybridflow(project, "run", "pipeline.yaml", "--force", "scael")
    assert wrong.returncode == 2 and "no stage named 'scael' (did you mean 'scale'?)" in wrong.stderr


def test_secrets_are_stored_only_as_keyed_hashes(project):
    setup(project, PIPELINE + "  keyed: {run: mypkg.steps:keyed, inputs: [numbers], outputs: [tagged], "
                              "params: {token: '${env:HF_TOKEN}'}}\n")
    secret = "hunter2-very-secret"
    assert hybridflow(project, "run", "pipeline.yaml", env={"HF_TOKEN": secret}).returncode == 0
    manifest = Catalog(project.home("demo")).current("tagged").manifest
    assert secret not in json.dumps(manifest) and manifest["fingerprint"]["params"]["token"].startswith("secret:")
    assert "0 of 4" in hybridflow(project, "plan", "pipeline.yaml", env={"HF_TOKEN": secret}).stdout
    plan = hybridflow(project, "plan", "pipeline.yaml", env={"HF_TOKEN": "another-secret-value"})
    assert plan_rows(plan.stdout)["keyed"] == ("run", "params.token changed (secret) -> (secret)")
    assert secret not in plan.stdout and "another-secret-value" not in plan.stdout
    assert (project.root / ".hybridflow" / ".fingerprint-key").stat().st_mode & 0o077 == 0


def test_resume_continues_from_the_failed_stage_with_the_same_arguments(project, tmp_path):
    fail = tmp_path / "fail"
    fail.touch()
    setup(project, PIPELINE + "  flaky: {run: mypkg.steps:flaky, inputs: [scaled], outputs: [checked]}\n")
    env = {"HF_FAIL_FILE": str(fail)}
    failed = hybridflow(project, "run", "pipeline.yaml", "-p", "n=6", env=env)
    assert failed.returncode == 1 and "resume with: hybridflow run pipeline.yaml --resume" in failed.stderr
    failed_run, _ = last_run_record(project.root / ".hybridflow")
    fail.unlink()
    resumed = hybridflow(project, "run", "pipeline.yaml", "--resume", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run" in resumed.stderr
    result = statuses(project)
    assert [result[s][0] for s in ("make", "scale", "report")] == ["skipped"] * 3  # n=6 again: unchanged
    assert result["flaky"] == ("done", f"failed in run {failed_run['run_id']}")
    checked = read_arrow(Catalog(project.home("demo")).current("checked").source())
    assert checked.num_rows == 6
    again = hybridflow(project, "run", "pipeline.yaml", "--resume", env=env)
    assert again.returncode == 0 and "nothing to resume" in again.stdout


INCREMENTAL = '''
name: inc
params: {}
datasets:
  raw: {path: raw, partition_by: [day], schema: {day: string, value: int64}}
  per_day: {partition_by: [day]}
stages:
  agg:
    run: mypkg.steps:agg
    incremental: true
    inputs: [raw]
    outputs: [per_day]
'''

AGG = '''
def agg(raw, ctx):
    days = sorted(raw["day"].unique())
    ctx.log.info("called for %s", ",".join(map(str, days)))
    out = raw.groupby("day", as_index=False)["value"].sum()
    return out.assign(run=ctx.run_id)
'''


def write_day(root: Path, day: str, values: list[int]) -> None:
    folder = root / "raw" / f"day={day}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"value": pa.array(values, pa.int64())}), folder / "part-0.parquet")


def per_day(project) -> pd.DataFrame:
    table = read_arrow(Catalog(project.home("inc")).current("per_day").source()).to_pandas()
    return table.sort_values("day").reset_index(drop=True)


def agg_log(project) -> str:
    _, stages = last_run_record(project.root / ".hybridflow")
    return Path(stages["agg"]["log_path"]).read_text()


def test_incremental_stage_processes_only_new_and_changed_partitions(project):
    project.stages(AGG)
    project.pipeline(INCREMENTAL)
    for day, values in (("d1", [1, 2]), ("d2", [3]), ("d3", [4, 5])):
        write_day(project.root, day, values)
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0
    first = per_day(project)
    assert first["value"].tolist() == [3, 3, 9] and "called for d1,d2,d3" in agg_log(project)

    write_day(project.root, "d4", [10])  # new
    write_day(project.root, "d2", [30, 1])  # changed
    done = hybridflow(project, "run", "pipeline.yaml")
    assert done.returncode == 0, done.stderr
    assert statuses(project)["agg"] == ("done", "2 of 4 partitions of raw new or changed (day=d2, day=d4)")
    assert "called for d2,d4" in agg_log(project)
    second = per_day(project)
    assert second["value"].tolist() == [3, 31, 9, 10]
    assert second.set_index("day")["run"].to_dict()["d1"] == first.set_index("day")["run"]["d1"]  # kept

    import shutil
    shutil.rmtree(project.root / "raw" / "day=d1")  # removed: its output goes, and the stage is not called
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0
    assert statuses(project)["agg"] == ("done", "1 partition of raw removed")
    assert "calling" not in agg_log(project)
    assert per_day(project)["day"].tolist() == ["d2", "d3", "d4"]

    incremental = per_day(project).drop(columns="run")
    assert hybridflow(project, "run", "pipeline.yaml", "--force").returncode == 0
    assert "called for d2,d3,d4" in agg_log(project)
    pd.testing.assert_frame_equal(per_day(project).drop(columns="run"), incremental)
    assert statuses(project)["agg"][0] == "done"
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0
    assert statuses(project)["agg"][0] == "skipped"


def test_a_code_change_reprocesses_every_partition(project):
    project.stages(AGG)
    project.pipeline(INCREMENTAL)
    write_day(project.root, "d1", [1])
    write_day(project.root, "d2", [2])
    hybridflow(project, "run", "pipeline.yaml")
    project.stages(AGG.replace("    days = sorted", "    raw = raw.copy()\n    days = sorted"))
    write_day(project.root, "d3", [3])
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0
    assert statuses(project)["agg"] == ("done", "function agg in mypkg/steps.py changed")
    assert "called for d1,d2,d3" in agg_log(project)


def test_an_incremental_output_outside_the_processed_partitions_is_refused(project):
    # a stage that writes a partition it was not given (here: from the second day on)
    project.stages(AGG.replace('return out.assign(run=ctx.run_id)',
                               'return out.assign(run=ctx.run_id, day=out["day"].str.replace("d2", "d2x"))'))
    project.pipeline(INCREMENTAL)
    write_day(project.root, "d1", [1])
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0
    write_day(project.root, "d2", [2])
    done = hybridflow(project, "run", "pipeline.yaml")
    assert done.returncode == 65
    assert "incremental output 'per_day' has partition day=d2x, which is not one of the input partitions" \
        in done.stderr
    assert per_day(project)["day"].tolist() == ["d1"]  # nothing of the bad run was published


def test_a_schema_change_in_new_partitions_is_refused_with_the_fix(project):
    # data-dependent types, as with pandas: large values make this stage write floats
    project.stages(AGG.replace('return out.assign(run=ctx.run_id)',
                               'big = (out["value"] > 100).any()\n'
                               '    return out.assign(run=ctx.run_id, '
                               'value=out["value"] / 2 if big else out["value"])'))
    project.pipeline(INCREMENTAL)
    write_day(project.root, "d1", [1])
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0
    write_day(project.root, "d2", [500])
    done = hybridflow(project, "run", "pipeline.yaml")
    assert done.returncode == 65
    assert "incremental output 'per_day' changed schema against its kept partitions: column 'value': " \
           "expected int64, got double (reprocess every partition: hybridflow run pipeline.yaml --force agg)" \
           in done.stderr
    assert per_day(project)["day"].tolist() == ["d1"]
    assert hybridflow(project, "run", "pipeline.yaml", "--force", "agg").returncode == 0
    assert per_day(project)["value"].tolist() == [0.5, 250.0]


def test_partition_directories_spelt_differently_still_match(project):
    """An int partition written as month=01 by the feed and month=1 by pyarrow is one partition."""
    project.stages(AGG.replace('"day"', '"month"'))
    project.pipeline(INCREMENTAL.replace("day: string", "month: int64").replace("[day]", "[month]")
                     .replace("per_day", "per_month"))
    for month, values in (("01", [1]), ("02", [2, 3])):
        folder = project.root / "raw" / f"month={month}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"value": pa.array(values, pa.int64())}), folder / "part-0.parquet")
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0
    import shutil
    shutil.rmtree(project.root / "raw" / "month=01")
    done = hybridflow(project, "run", "pipeline.yaml")
    assert done.returncode == 0, done.stderr
    assert statuses(project)["agg"] == ("done", "1 partition of raw removed")
    table = read_arrow(Catalog(project.home("inc")).current("per_month").source()).to_pandas()
    assert table["month"].tolist() == [2] and table["value"].tolist() == [5]


def test_incremental_needs_a_partitioned_input_and_matching_outputs(project):
    project.stages(AGG)
    project.pipeline(INCREMENTAL.replace("per_day: {partition_by: [day]}", "per_day: {}"))
    done = hybridflow(project, "validate", "pipeline.yaml")
    assert done.returncode == 78
    assert "pipeline.yaml:9:18: error: output 'per_day' of incremental stage 'agg' must be partitioned like " \
           "its input 'raw' (partition_by: [day]), not []" in done.stdout


GC = PIPELINE.replace("params:", "keep_versions: 2\nparams:")


def test_gc_keeps_the_newest_versions_and_the_current_lineage(project):
    setup(project, GC)
    assert hybridflow(project, "run", "pipeline.yaml").returncode == 0
    catalog = Catalog(project.home("demo"))
    scaled_from = catalog.current("scaled").manifest["inputs"]["numbers"]
    for n in (5, 6, 7):  # new versions of numbers only; scaled still comes from the first one
        assert hybridflow(project, "run", "pipeline.yaml", "--only", "make", "-p", f"n={n}").returncode == 0
    numbers = catalog.versions("numbers")
    assert len(numbers) == 3 and scaled_from in numbers  # 2 newest + the one scaled was made from
    assert numbers[-1] == catalog.current("numbers").id
    dry = hybridflow(project, "gc", "pipeline.yaml", "--keep", "1", "--dry-run")
    assert dry.returncode == 0 and "would remove 1 version (" in dry.stdout
    assert len(catalog.versions("numbers")) == 3
    assert hybridflow(project, "gc", "pipeline.yaml", "--keep", "1").returncode == 0
    assert catalog.versions("numbers") == sorted([scaled_from, catalog.current("numbers").id])
    assert read_arrow(catalog.current("scaled").source()).num_rows == 4  # still readable


def test_an_old_run_database_gets_the_new_columns(tmp_path):
    db = sqlite3.connect(tmp_path / "runs.db")
    db.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, pipeline TEXT NOT NULL, pipeline_file TEXT, "
               "trigger TEXT NOT NULL, started_at TEXT NOT NULL, ended_at TEXT, status TEXT NOT NULL, error TEXT, "
               "run_dir TEXT)")
    db.execute("INSERT INTO runs VALUES ('r1', 'p', 'f', 'manual', '2026-01-01', NULL, 'success', NULL, NULL)")
    db.commit()
    db.close()
    store = RunStore(tmp_path / "runs.db")
    store.save_run(run_id="r2", pipeline="p", trigger="cron", started_at="2026-01-02", status="success",
                   arguments="{}")
    assert [r["run_id"] for r in store.runs("p")] == ["r2", "r1"]
    assert store.last_run("p")["arguments"] == "{}"
