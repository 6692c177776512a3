"""The runner on the python backend: data flow, params, failures, selection and safety."""


import pytest

from hybridflow.data.tables import read_arrow
from hybridflow.definition.config import check_file, load_pipeline
from hybridflow.errors import DataError, ExitCode, LockedError
from hybridflow.execution.runner import Runner
from hybridflow.results import RunOptions, Selection
from hybridflow.store.catalog import Catalog
from hybridflow.store.lock import RunLock
from tests.support.projects import last_run_record

STAGES = '''
import numpy as np
import pandas as pd
import pyarrow as pa


def make(ctx, n: int = 3):
    print("hello from make")
    ctx.log.info("making %d rows", n)
    frame = pd.DataFrame({"id": range(n), "value": [i * 1.5 for i in range(n)]})
    return {"numbers": frame, "meta": pa.table({"run": [ctx.run_id], "stage": [ctx.stage]})}


def double(numbers, factor, ctx):
    assert isinstance(numbers, pd.DataFrame)
    assert numbers["id"].dtype == np.dtype("int64")  # numpy where it holds the values exactly
    out = numbers.assign(value=numbers["value"] * factor)
    (ctx.output_path("artifact") / "note.txt").write_text(f"factor={factor}")
    return {"doubled": out}


def empty(numbers):
    return numbers.iloc[0:0]


def boom(numbers):
    raise ValueError("the data is bad: " + str(len(numbers)))


def independent():
    return pd.DataFrame({"x": [1]})


def use(events):
    return events


def sink(doubled, ctx):
    ctx.log.info("sink saw %d rows", len(doubled))
'''

PIPELINE = '''
name: demo
params: {factor: 2, n: 4}
stages:
  make:
    run: mypkg.steps:make
    outputs: [numbers, meta]
  double:
    run: mypkg.steps:double
    inputs: [numbers]
    outputs: [doubled, artifact]
    params: {factor: 3}
  sink:
    run: mypkg.steps:sink
    inputs: [doubled]
datasets:
  artifact: {kind: files}
'''


def run(path, params=(), **options):
    return Runner(load_pipeline(path, list(params)), RunOptions(**options)).run()


def current_frame(project, dataset, pipeline="demo"):
    version = Catalog(project.home(pipeline)).current(dataset)
    return read_arrow(version.source()).to_pandas()


def test_end_to_end_run_publishes_every_output(project):
    project.stages(STAGES)
    result = run(project.pipeline(PIPELINE))
    assert result.status == "success", result.error
    assert [s.status for s in result.stages.values()] == ["done", "done", "done"]
    numbers = current_frame(project, "numbers")
    assert numbers["id"].tolist() == [0, 1, 2, 3]  # n=4 from pipeline params
    doubled = current_frame(project, "doubled")
    assert doubled["value"].tolist() == [0.0, 4.5, 9.0, 13.5]  # stage param factor=3 beats pipeline's 2
    meta = current_frame(project, "meta")
    assert meta["run"].tolist() == [result.run_id] and meta["stage"].tolist() == ["make"]
    artifact = Catalog(project.home("demo")).current("artifact")
    assert (artifact.directory / "note.txt").read_text() == "factor=3"
    manifest = Catalog(project.home("demo")).current("doubled").manifest
    assert manifest["inputs"] == {"numbers": result.stages["make"].outputs["numbers"]}
    assert result.stages["make"].rows_out == 5  # 4 numbers + 1 meta row
    log = (result.run_dir / "logs" / "make.log").read_text()
    assert "hello from make" in log and "making 4 rows" in log
    record, stages = last_run_record(project.root / ".hybridflow")
    assert record["run_id"] == result.run_id and record["status"] == "success"
    assert stages["sink"]["status"] == "done" and stages["make"]["fingerprint"]
    assert not any((project.home("demo") / "staging").iterdir())


def test_cli_params_override_stage_and_pipeline_params(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    run(path, ["factor=10", "make.n=2"])
    assert current_frame(project, "doubled")["value"].tolist() == [0.0, 15.0]
    run(path, ["factor=10", "double.factor=1"])
    assert current_frame(project, "doubled")["value"].tolist() == [0.0, 1.5, 3.0, 4.5]


def test_stage_failure_is_located_in_user_code_and_blocks_dependents(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE.replace("mypkg.steps:double", "mypkg.steps:boom")
                            .replace("    params: {factor: 3}\n", "")
                            .replace("outputs: [doubled, artifact]", "outputs: [doubled]"))
    result = run(path)
    assert result.status == "failed"
    assert result.error.exit_code == ExitCode.STAGE_FAILED
    failed = result.stages["double"]
    assert failed.status == "failed"
    assert failed.error.startswith("ValueError: the data is bad: 4 (mypkg/steps.py:")
    assert "in boom" in failed.error
    assert result.stages["sink"].status == "not run"
    assert "Traceback" in (result.run_dir / "logs" / "double.log").read_text()
    assert result.resume_command.endswith("pipeline.yaml --resume")
    assert Catalog(project.home("demo")).current("doubled") is None


def test_keep_going_runs_independent_stages_after_a_failure(project):
    project.stages(STAGES)
    text = '''
    name: demo
    stages:
      make: {run: "mypkg.steps:make", outputs: [numbers, meta]}
      bad: {run: "mypkg.steps:boom", inputs: [numbers], outputs: [doubled]}
      after_bad: {run: "mypkg.steps:sink", inputs: [doubled]}
      other: {run: "mypkg.steps:independent", outputs: [x]}
    '''
    path = project.pipeline(text)
    stopped = run(path)
    assert stopped.stages["other"].status == "not run"
    going = run(path, keep_going=True)
    assert going.status == "failed"
    assert going.stages["other"].status == "done"
    assert going.stages["after_bad"].status == "not run"


def test_selection_needs_published_inputs(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    with pytest.raises(DataError, match="input 'numbers' of stage 'double' is not published yet") as info:
        run(path, selection=Selection(only=["double"]))
    assert "--to make" in info.value.hint
    assert run(path, selection=Selection(end=["make"])).stages.keys() == {"make"}
    result = run(path, selection=Selection(start=["double"]))
    assert list(result.stages) == ["double", "sink"] and result.status == "success"


def test_empty_output_is_published_with_its_schema(project):
    project.stages(STAGES)
    text = '''
    name: demo
    stages:
      make: {run: "mypkg.steps:make", outputs: [numbers, meta]}
      empty: {run: "mypkg.steps:empty", inputs: [numbers], outputs: [none_left]}
    '''
    run(project.pipeline(text))
    version = Catalog(project.home("demo")).current("none_left")
    assert version.rows == 0
    table = read_arrow(version.source())
    assert table.num_rows == 0 and table.schema.names == ["id", "value"]


@pytest.mark.parametrize("body, message", [
    ("return None", "did not return its output 'out'"),
    ("return {'out': pd.DataFrame({'a': [1]}), 'other': pd.DataFrame()}", "returned 'other', which is not one"),
    ("return [1, 2]", "returned a list for output 'out'"),
])
def test_wrong_return_values_fail_the_stage_clearly(project, body, message):
    project.stages(f"import pandas as pd\n\ndef bad():\n    {body}\n")
    result = run(project.pipeline("name: demo\nstages:\n  bad: {run: 'mypkg.steps:bad', outputs: [out]}\n"))
    assert result.status == "failed"
    assert message in result.stages["bad"].error


def test_external_csv_input_is_typed_by_its_schema_and_checked(project):
    project.write("raw/events.csv", "id,amount,ts\n1,2.50,2026-01-05T10:00:00Z\n2,,2026-01-06T11:00:00Z\n")
    project.stages("def copy(events):\n    return events\n")
    text = '''
    name: demo
    datasets:
      events:
        path: raw/events.csv
        format: csv
        schema: {id: int64, amount: "decimal(10,2)", ts: "timestamp[us, tz=UTC]"}
    stages:
      copy: {run: "mypkg.steps:copy", inputs: [events], outputs: [copied]}
    '''
    path = project.pipeline(text)
    assert run(path).status == "success"
    version = Catalog(project.home("demo")).current("copied")
    assert version.manifest["schema"] == {"id": "int64", "amount": "decimal128(10, 2)", "ts": "timestamp[us, tz=UTC]"}
    assert version.manifest["inputs"]["events"].startswith("external:")
    project.write("raw/events.csv", "id,amount,ts,extra\n1,2.50,2026-01-05T10:00:00Z,x\n")
    result = run(path)
    assert result.error.exit_code == ExitCode.DATA
    assert "column 'extra' (string) is not in the declared schema" in result.stages["copy"].error


def test_missing_external_input_fails_before_any_stage(project):
    project.stages(STAGES)
    text = '''
    name: demo
    datasets:
      events: {path: raw/missing.parquet}
    stages:
      make: {run: "mypkg.steps:make", outputs: [numbers, meta]}
      use: {run: "mypkg.steps:use", inputs: [events], outputs: [x]}
    '''
    with pytest.raises(DataError, match="external input 'events' of stage 'use' does not exist"):
        run(project.pipeline(text))
    assert Catalog(project.home("demo")).current("numbers") is None  # nothing ran


def test_secrets_from_the_environment_never_reach_logs_or_records(project, monkeypatch):
    secret = "s3cr3t-token-value"
    monkeypatch.setenv("HF_TEST_TOKEN", secret)
    project.stages("def leak(token, ctx):\n    ctx.log.info('token is %s', token)\n    print('printed', token)\n"
                   "    raise RuntimeError('bad token ' + token)\n")
    text = "name: demo\nparams: {token: '${env:HF_TEST_TOKEN}'}\nstages:\n  leak: {run: 'mypkg.steps:leak'}\n"
    result = run(project.pipeline(text))
    assert result.status == "failed"
    assert secret not in result.stages["leak"].error and "***" in result.stages["leak"].error
    assert secret not in (project.root / ".hybridflow" / "runs.db").read_bytes().decode("latin-1")
    log = (result.run_dir / "logs" / "leak.log").read_text()
    assert "token is ***" in log and "printed ***" in log and secret not in log


def test_a_second_run_is_refused_while_the_lock_is_held(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    holder = RunLock(project.home("demo") / "run.lock")
    holder.acquire("20260101T000000Z-abcdef")
    try:
        with pytest.raises(LockedError, match="run 20260101T000000Z-abcdef started"):
            run(path)
    finally:
        holder.release()
    assert run(path).status == "success"


def test_leftover_staging_of_a_dead_run_is_cleaned(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    assert run(path).status == "success"  # the workdir, as any run (the dead one too) makes it first
    leftover = project.home("demo") / "staging" / "20200101T000000Z-dead00" / "numbers"
    leftover.mkdir(parents=True)
    (leftover / "part-00000.parquet").write_bytes(b"half written")
    assert run(path).status == "success"
    assert not leftover.exists()


def test_modules_of_two_projects_do_not_shadow_each_other(tmp_path):
    from tests.conftest import Project

    results = []
    for label in ("first", "second"):
        p = Project(tmp_path / label)
        p.stages(f"import pandas as pd\n\ndef make():\n    return pd.DataFrame({{'who': ['{label}']}})\n")
        run(p.pipeline("name: demo\nstages:\n  make: {run: 'mypkg.steps:make', outputs: [who]}\n"))
        results.append(current_frame(p, "who")["who"].tolist())
    assert results == [["first"], ["second"]]


def test_partitioned_dataset_flows_between_stages_with_its_declared_type(project):
    project.stages('''
import datetime as dt
import pandas as pd
import pyarrow as pa


def make():
    return pa.table({"week": pa.array([dt.date(2026, 11, 9), dt.date(2026, 11, 16)] * 2, pa.date32()),
                     "n": [1, 2, 3, 4]})


def check(weekly):
    assert weekly["week"].dtype == pd.ArrowDtype(pa.date32()), weekly.dtypes
    return weekly.groupby("week", as_index=False)["n"].sum()
''')
    path = project.pipeline('''
    name: demo
    datasets:
      weekly: {partition_by: [week], schema: {week: date32, n: int64}}
    stages:
      make: {run: "mypkg.steps:make", outputs: [weekly]}
      check: {run: "mypkg.steps:check", inputs: [weekly], outputs: [totals]}
    ''')
    assert run(path).status == "success"
    version = Catalog(project.home("demo")).current("weekly")
    assert sorted({f.parent.name for f in version.files}) == ["week=2026-11-09", "week=2026-11-16"]
    assert version.manifest["partition_by"] == ["week"]
    assert current_frame(project, "totals")["n"].tolist() == [4, 6]


def test_an_output_breaking_its_contract_leaves_every_output_of_the_stage_unpublished(project):
    project.stages("import pandas as pd\n\ndef two():\n    frame = pd.DataFrame({'x': [1]})\n"
                   "    return {'a': frame, 'b': frame}\n")
    path = project.pipeline('''
    name: demo
    datasets:
      b: {schema: {x: string}}
    stages:
      two: {run: "mypkg.steps:two", outputs: [a, b]}
    ''')
    result = run(path)
    assert result.error.exit_code == ExitCode.DATA
    assert "column 'x': expected string, got int64" in result.stages["two"].error
    catalog = Catalog(project.home("demo"))
    assert catalog.current("a") is None and catalog.current("b") is None


def test_secrets_never_appear_in_config_problems_or_preflight_errors(project, monkeypatch):
    secret = "s3cr3t-dir-name"
    monkeypatch.setenv("HF_TEST_SECRET", secret)
    project.stages("def use(events):\n    return events\n")
    bad = project.pipeline("name: demo\nstages:\n  use: {run: 'mypkg.steps:use', retries: '${env:HF_TEST_SECRET}'}\n")
    _, problems = check_file(bad)
    assert problems and all(secret not in p.message for p in problems)
    missing = project.pipeline('''
    name: demo
    datasets:
      events: {path: "raw/${env:HF_TEST_SECRET}/events.parquet"}
    stages:
      use: {run: "mypkg.steps:use", inputs: [events], outputs: [x]}
    ''', "missing.yaml")
    with pytest.raises(DataError) as info:
        run(missing)
    assert secret not in info.value.one_line() and "***" in info.value.one_line()


def test_a_cli_param_can_satisfy_a_required_parameter(project):
    project.stages("import pandas as pd\n\ndef make(n):\n    return pd.DataFrame({'i': range(n)})\n")
    path = project.pipeline("name: demo\nstages:\n  make: {run: 'mypkg.steps:make', outputs: [numbers]}\n")
    _, problems = check_file(path)
    assert any("parameter 'n' gets no value" in p.message for p in problems)
    assert run(path, ["make.n=3"]).status == "success"
    assert current_frame(project, "numbers")["i"].tolist() == [0, 1, 2]


def test_errors_raised_inside_libraries_point_at_the_stage_not_the_library(project):
    project.write(".venv/lib/python3.11/site-packages/fakelib.py", "def explode():\n    raise KeyError('deep')\n")
    project.stages("import sys\nsys.path.insert(0, __file__.rsplit('/mypkg', 1)[0] + "
                   "'/.venv/lib/python3.11/site-packages')\nimport fakelib\n\n\ndef make():\n    fakelib.explode()\n")
    result = run(project.pipeline("name: demo\nstages:\n  make: {run: 'mypkg.steps:make', outputs: [x]}\n"))
    assert result.stages["make"].error == "KeyError: 'deep' (mypkg/steps.py:7 in make)"


def test_unnamed_index_is_dropped_and_named_index_kept(project):
    project.stages('''
import pandas as pd


def make():
    frame = pd.DataFrame({"k": [3, 1, 2], "v": [30, 10, 20]})
    return {"filtered": frame[frame["v"] > 10], "indexed": frame.set_index("k")}
''')
    run(project.pipeline("name: demo\nstages:\n  make: {run: 'mypkg.steps:make', outputs: [filtered, indexed]}\n"))
    assert list(current_frame(project, "filtered").columns) == ["k", "v"]
    assert list(current_frame(project, "indexed").columns) == ["k", "v"]


def test_published_files_are_read_only(project):
    project.stages(STAGES)
    run(project.pipeline(PIPELINE))
    version = Catalog(project.home("demo")).current("artifact")
    assert all(oct(f.stat().st_mode & 0o777) == "0o444" for f in version.directory.rglob("*") if f.is_file())


def test_a_runs_events_reach_the_listener_after_its_record_and_report(project):
    """The runner emits each event once; the run's records, its report and the caller's listener
    subscribe in that order, so what the listener is told at the end is already recorded and reported."""
    import hybridflow
    from hybridflow.results import Listener

    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    seen = {}

    class Looking(Listener):
        def stage_changed(self, stage) -> None:
            if stage.status == "done":
                [run] = hybridflow.runs(path, limit=1, stages=True)
                seen.setdefault(stage.name, {s["stage"]: s["status"] for s in run["stages"]}.get(stage.name))

        def run_finished(self, result) -> None:
            [run] = hybridflow.runs(path, limit=1)
            seen["run"] = (run["run_id"] == result.run_id, run["status"], (result.run_dir / "report.html").exists())

    result = hybridflow.run(path, listener=Looking())
    assert result.status == "success"
    assert seen.pop("run") == (True, "success", True)
    assert seen and set(seen.values()) == {"done"}  # each stage's row was saved before the listener heard
