"""The hybridflow command through typer's CliRunner: output, exit codes, and no raw tracebacks."""

import json

from typer.testing import CliRunner

from hybridflow.backends import BUILT_IN
from hybridflow.cli import app
from hybridflow.errors import ExitCode
from hybridflow.installing import install_extras
from tests.support.projects import last_run_record
from tests.unit.test_runner import PIPELINE, STAGES

cli = CliRunner()

# plain stages for the tests below: make -> double -> sink, nothing asserted about dtypes
STEPS = '''
import pandas as pd


def make(n: int = 3):
    print("hello from make")
    return {"numbers": pd.DataFrame({"id": range(n)}), "meta": pd.DataFrame({"n": [n]})}


def double(numbers, factor):
    return {"doubled": numbers.assign(id=numbers["id"] * factor)}


def sink(doubled):
    return pd.DataFrame({"rows": [len(doubled)]})
'''
STEPS_PIPELINE = '''
name: demo
params: {factor: 2}
stages:
  make: {run: mypkg.steps:make, outputs: [numbers, meta]}
  double: {run: mypkg.steps:double, inputs: [numbers], outputs: [doubled]}
  sink: {run: mypkg.steps:sink, inputs: [doubled], outputs: [total]}
'''


def invoke(*args):
    return cli.invoke(app, [str(a) for a in args])


def test_validate_reports_every_problem_with_its_location(project):
    path = project.pipeline('''
    name: demo
    stages:
      clean:
        backend: sparc
        run: mypkg.steps:make
        ouputs: [x]
    ''')
    project.stages(STAGES)
    result = invoke("validate", path)
    assert result.exit_code == ExitCode.CONFIG
    lines = result.output.splitlines()
    assert f"{path}:4:14: error: stages.clean.backend must be one of {', '.join(BUILT_IN)}, not 'sparc' " \
           "(did you mean 'spark'?)" in lines
    assert f"{path}:6:5: error: unknown key 'ouputs' in stages.clean (did you mean 'outputs'?)" in lines
    assert "Traceback" not in result.output


def test_validate_directory_and_json_format(project):
    project.stages(STAGES)
    project.pipeline("root: ..\n" + PIPELINE.lstrip(), "configs/good.yaml")
    project.pipeline("name: bad\nstages: {}\n", "configs/nested/bad.yml")
    result = invoke("validate", "--format", "json", project.root / "configs")
    assert result.exit_code == ExitCode.CONFIG
    report = json.loads(result.output)
    assert report["valid"] is False
    assert len(report["files"]) == 2
    [problem] = report["problems"]
    assert problem["file"].endswith("bad.yml") and problem["line"] == 2
    assert "at least one stage" in problem["message"]


def test_validate_ok_exits_zero(project):
    project.stages(STAGES)
    result = invoke("validate", project.pipeline(PIPELINE))
    assert result.exit_code == 0, result.output
    assert "valid (0 errors, 0 warnings)" in result.output


def test_validate_refuses_partition_columns_engines_name_directories_differently(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE + "  numbers: {partition_by: ['col.with dot ü', 'a/b', 'x=y', '.hidden']}\n")
    result = invoke("validate", path)
    assert result.exit_code == ExitCode.CONFIG
    refused = [line for line in result.output.splitlines() if "cannot be partitioned by" in line]
    assert [line.split("partitioned by ")[1].split(":")[0] for line in refused] == ["'a/b'", "'x=y'", "'.hidden'"]


def test_run_prints_summary_and_exit_code(project):
    project.stages(STAGES)
    result = invoke("run", project.pipeline(PIPELINE))
    assert result.exit_code == 0, result.output
    assert "success" in result.output
    for stage in ("make", "double", "sink"):
        assert stage in result.output


def test_run_failure_shows_one_line_error_log_path_and_resume(project):
    project.stages(STAGES)
    path = project.pipeline("name: demo\nstages:\n  make: {run: 'mypkg.steps:make', outputs: [numbers, meta]}\n"
                            "  bad: {run: 'mypkg.steps:boom', inputs: [numbers], outputs: [y]}\n")
    result = invoke("run", path)
    assert result.exit_code == ExitCode.STAGE_FAILED
    assert "bad failed: ValueError: the data is bad: 3 (mypkg/steps.py:" in result.output
    assert "log: " in result.output and "bad.log" in result.output
    assert f"resume with: hybridflow run {path} --resume" in result.output
    assert "Traceback" not in result.output


def test_run_config_error_is_one_line_with_exit_78(project):
    path = project.pipeline("name: demo\nstages:\n  a: {run: 'nope:fn'}\n")
    result = invoke("run", path)
    assert result.exit_code == ExitCode.CONFIG
    # the line validate prints, labelled once: never "error: file:3:12: error: ..."
    [line] = result.output.splitlines()
    assert line.startswith(f"{path}:3:12: error: stage 'a': module 'nope' not found"), line
    assert line.count("error:") == 1, line
    assert "Traceback" not in result.output
    verbose = invoke("run", path, "--verbose")
    assert "Traceback" in verbose.output


def test_config_error_counts_the_other_errors_in_agreement(project):
    one_more = project.pipeline("name: demo\nstages:\n  a: {run: 'nope:fn'}\n  b: {run: 'nope:fn'}\n")
    [line] = invoke("plan", one_more).output.splitlines()
    assert line.endswith("(and 1 more error; hybridflow validate lists them)"), line
    two_more = project.pipeline("name: demo\nstages:\n  a: {run: 'nope:fn'}\n  b: {run: 'nope:fn'}\n"
                                "  c: {run: 'nope:fn'}\n", "three.yaml")
    [line] = invoke("run", two_more).output.splitlines()
    assert line.endswith("(and 2 more errors; hybridflow validate lists them)"), line
    assert line.count("error:") == 1, line


def test_counts_in_output_agree_with_their_nouns(project):
    path = project.pipeline("name: demo\nstages:\n  a: {run: 'nope:fn'}\n")
    assert "1 file checked: invalid (1 error, 0 warnings)" in invoke("validate", path).output
    project.stages(STEPS)
    single = project.pipeline("name: solo\nstages:\n  make: {run: 'mypkg.steps:make', outputs: [numbers, meta]}\n",
                              "solo.yaml")
    assert "1 of 1 stage to run, 0 up to date" in invoke("plan", single).output
    ran = invoke("run", single)
    assert ran.exit_code == 0 and "run 2" in ran.output and ": 1 stage\n" in ran.output, ran.output
    assert "removed 0 versions (" in invoke("gc", single).output


def test_bare_force_works_before_the_file_on_every_command_that_takes_it(project):
    project.stages(STEPS)
    path = project.pipeline(STEPS_PIPELINE)
    assert invoke("run", path).exit_code == 0
    assert "0 of 3 stages to run, 3 up to date" in invoke("plan", path).output
    expected = {
        ("plan", "--force", path): "3 of 3 stages to run, 0 up to date",  # was: Missing argument 'PIPELINE.yaml'
        ("plan", path, "--force"): "3 of 3 stages to run, 0 up to date",
        ("plan", "--force", "--only", "make", path): "1 of 1 stage to run, 0 up to date",
        ("run", "--force", path, "--dry-run"): "3 of 3 stages to run, 0 up to date",
        ("run", "--force", "--dry-run", path): "3 of 3 stages to run, 0 up to date",
        # a stage list is still a stage list, before or after the file
        ("plan", "--force", "sink", path): "1 of 3 stages to run, 2 up to date",
        ("plan", path, "--force", "double,sink"): "2 of 3 stages to run, 1 up to date",
        ("plan", "--force=sink", path): "1 of 3 stages to run, 2 up to date",
    }
    for args, summary in expected.items():
        result = invoke(*args)
        assert result.exit_code == 0 and summary in result.output, (args, result.output)
    forced = invoke("run", "--force", path)
    assert forced.exit_code == 0, forced.output
    _, stages = last_run_record(project.root / ".hybridflow")
    assert {s["status"] for s in stages.values()} == {"done"}, stages
    typo = invoke("plan", "--force", "mkae", path)
    assert typo.exit_code == ExitCode.USAGE and "no stage named 'mkae' (did you mean 'make'?)" in typo.output


def test_version():
    from importlib.metadata import version

    result = invoke("--version")
    assert result.exit_code == 0
    assert result.output == f"hybridflow {version('hybridflow')}\n"


def test_every_missing_engine_is_named_in_one_line(project, monkeypatch):
    import dataclasses

    from hybridflow import backends

    # engines whose packages are not installed, whatever this machine has (the registry's declarations)
    for name, module in (("spark", "hybridflow_test_no_pyspark"), ("ray", "hybridflow_test_no_ray")):
        monkeypatch.setitem(backends.engines(), name, dataclasses.replace(backends.engine(name), requires=(module,)))
    project.stages(STEPS)
    path = project.pipeline("name: demo\nstages:\n"
                            "  make: {run: 'mypkg.steps:make', backend: spark, outputs: [numbers, meta]}\n"
                            "  double: {run: 'mypkg.steps:double', backend: ray, inputs: [numbers], outputs: [doubled],"
                            " params: {factor: 2}}\n"
                            "  sink: {run: 'mypkg.steps:sink', inputs: [doubled], outputs: [total]}\n")
    result = invoke("run", path)
    assert result.exit_code == ExitCode.UNAVAILABLE, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == ["error: backend 'spark' needs hybridflow_test_no_pyspark and backend 'ray' needs "
                      f"hybridflow_test_no_ray, which are not installed ({install_extras('spark,ray')})"], \
        result.output
    assert not (project.home("demo") / "datasets").exists()  # nothing ran


def test_dry_run_prints_plan_and_runs_nothing(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    result = invoke("run", path, "--dry-run")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("│")]
    assert [line.split("│")[2].strip() for line in lines] == ["make", "double", "sink"]
    assert "never run" in lines[0] and "input numbers will be rebuilt by stage make" in lines[1]
    assert "3 of 3 stages to run, 0 up to date" in result.output
    assert not (project.home("demo") / "datasets").exists()


def test_param_for_unknown_stage_is_a_config_error(project):
    project.stages(STAGES)
    result = invoke("run", project.pipeline(PIPELINE), "--param", "dubble.factor=2")
    assert result.exit_code == ExitCode.CONFIG
    assert "there is no stage 'dubble' (did you mean 'double'?)" in result.output


def test_unknown_selection_stage_is_a_config_error(project):
    project.stages(STAGES)
    result = invoke("run", project.pipeline(PIPELINE), "--only", "mke")
    assert result.exit_code == ExitCode.CONFIG
    assert "no stage named 'mke' (did you mean 'make'?)" in result.output


def test_graph_mermaid_and_dot(project):
    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    mermaid = invoke("graph", path)
    assert mermaid.exit_code == 0
    assert mermaid.output.startswith("flowchart LR")
    assert "st_make --> ds_numbers" in mermaid.output and "ds_numbers --> st_double" in mermaid.output
    dot = invoke("graph", path, "--format", "dot")
    assert dot.output.startswith('digraph "demo"') and "st_double -> ds_artifact;" in dot.output
    assert invoke("graph", path, "--format", "png").exit_code == ExitCode.CONFIG


def test_schema_is_json_schema_of_the_pipeline_file():
    result = invoke("schema")
    schema = json.loads(result.output)
    assert schema["title"] == "hybridflow pipeline"
    assert set(schema["required"]) == {"name", "stages"}
    stage = schema["$defs"]["StageSpec"]
    assert stage["additionalProperties"] is False
    assert "run" in stage["required"]
    assert "schema" in schema["$defs"]["DatasetSpec"]["properties"]
    # cluster: is offered only where an engine has a cluster to bring up
    engines = {name: "cluster" in schema["$defs"][f"{name}Settings"]["properties"]
               for name in ("Spark", "Dask", "Ray", "Python", "DuckDB", "Polars")}
    assert engines == {"Spark": True, "Dask": True, "Ray": True, "Python": False, "DuckDB": False, "Polars": False}


def test_usage_error_exit_code():
    assert invoke("run").exit_code == ExitCode.USAGE


def test_messages_with_brackets_are_printed_verbatim(project):
    path = project.pipeline("name: demo\nstages:\n  a: {run: 'x:y', inputs: events}\n")
    result = invoke("validate", path)
    assert "must be a list of dataset names, e.g. [events], not 'events'" in result.output


def test_the_command_exits_with_its_code_after_exit_handlers_and_output(tmp_path):
    """`hybridflow` (cli.main) skips the interpreter's teardown at exit: the exit code, what the
    command printed and what exit handlers do must all be as a normal exit leaves them."""
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: demo\nstages:\n  one: {run: nowhere:fn, outputs: [x], colour: red}\n")
    marker = tmp_path / "handler-ran"
    script = ("import atexit, sys\n"
              f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
              "from hybridflow.cli import main\n"
              f"sys.argv = ['hybridflow', 'validate', {str(bad)!r}]\n"
              "main()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == int(ExitCode.CONFIG), done.stderr
    assert "colour" in done.stdout + done.stderr
    assert "checked" in done.stdout + done.stderr  # the last line printed was flushed
    assert marker.read_text() == "ran"


CHATTY = """
import io, logging, sys, threading
import hybridflow.cli

def chatty_run():  # runs as the command, after what main() sets up
    terminal, elsewhere = sys.stderr, io.StringIO()
    sys.stderr = elsewhere  # while engines start, sys.stderr is a copy of the terminal; in a stage, its log
    # a library logging at module level from a thread of its own (py4j does once its JVM stopped):
    # left alone, Python's logging then configures the root logger on whatever sys.stderr is now
    thread = threading.Thread(target=logging.info, args=("library chatter",))
    thread.start()
    thread.join()
    sys.stderr = terminal
    engine = logging.getLogger("chatty.engine")
    engine.setLevel(logging.INFO)
    engine.info("an engine's info record")  # reaches the root logger's handlers
    logging.getLogger("user.code").warning("a warning from the stage")
    print("elsewhere: " + elsewhere.getvalue().replace(chr(10), " | "))

hybridflow.cli.app = chatty_run
hybridflow.cli.main()
"""


def test_the_command_shows_warnings_on_the_current_stderr_and_no_library_info_records():
    """Whatever a library's logging does (configure the root logger from a thread, at any moment),
    the command prints no record below a warning, and a warning goes to the stderr of the moment."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CHATTY], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "elsewhere:", done.stdout  # nothing went to the stream of that moment
    assert done.stderr.strip() == "a warning from the stage", done.stderr
