"""Error text quotes no more of the data than it needs: errors go to cron mail, notifications and
run records, and a malformed row can hold anything (an e-mail address, a card number, a megabyte)."""

import pickle
from pathlib import Path

import pytest

from hybridflow.definition.config import load_pipeline
from hybridflow.errors import LINE_CHARS, QUOTE_CHARS, DataError, ExitCode, first_line, one_line_of
from hybridflow.execution.errorsite import describe_user_error
from hybridflow.execution.runner import Runner
from tests.support.projects import last_run_record

ROW = "2,2026-01-05,store-0042," + "private note " * 20 + ",4111-1111-1111-1111"  # 5 fields, 1 declared

STAGES = '''
import pyarrow.csv as pacsv


def use(events):
    return events


def parse(ctx):
    return pacsv.read_csv(ctx.params["file"])
'''


def test_a_malformed_csv_row_is_quoted_only_as_a_short_prefix(project):
    project.stages(STAGES)
    project.write("raw/events.csv", f"id\n1\n{ROW}\n")
    path = project.pipeline('''
    name: bad-csv
    datasets:
      events: {path: raw/events.csv, format: csv, schema: {id: int64}}
    stages:
      use: {run: "mypkg.steps:use", backend: python, inputs: [events], outputs: [used]}
    ''')
    result = Runner(load_pipeline(path)).run()
    assert result.status == "failed" and result.error.exit_code == ExitCode.DATA
    message = result.error.one_line()
    assert f"Expected 1 columns, got 5: {ROW[:QUOTE_CHARS]}… (" in message  # enough to find the row
    assert "4111-1111" not in message
    record, stages = last_run_record(project.root / ".hybridflow")
    for text in (record["error"], stages["use"]["error"] or ""):
        assert "4111-1111" not in text and len(text) < 2 * LINE_CHARS


def test_a_stage_that_parses_a_bad_row_itself_is_cut_the_same_way(project):
    project.stages(STAGES)
    bad = project.write("raw/events.csv", f"id\n1\n{ROW}\n")
    path = project.pipeline(f'''
    name: own-parse
    stages:
      parse: {{run: "mypkg.steps:parse", backend: python, outputs: [parsed], params: {{file: "{bad}"}}}}
    ''')
    result = Runner(load_pipeline(path)).run()
    assert result.status == "failed" and result.error.exit_code == ExitCode.STAGE_FAILED
    error = result.stages["parse"].error
    assert error.startswith(f"ArrowInvalid: CSV parse error: Expected 1 columns, got 5: {ROW[:QUOTE_CHARS]}… (")
    assert "4111-1111" not in error and "(mypkg/steps.py:" in error  # the place is still there
    assert ROW[:QUOTE_CHARS + 20] in (result.run_dir / "logs" / "parse.log").read_text()  # the log keeps more


def test_a_long_value_in_a_conversion_error_is_cut_inside_its_quotes():
    value = "x" * 500
    text = f"In CSV column #0: CSV conversion error to int64: invalid value '{value}'"
    line = first_line(ValueError(text))
    assert line == f"In CSV column #0: CSV conversion error to int64: invalid value '{'x' * QUOTE_CHARS}…'"


def test_a_users_own_message_is_kept_whole_unless_it_is_very_long(tmp_path: Path):
    own = "the data is bad: 'customer_segment' has 3 unknown values (expected one of 'a', 'b')"
    assert describe_user_error(ValueError(own), tmp_path) == f"ValueError: {own}"
    huge = describe_user_error(ValueError("row dump " + "y" * 5000), tmp_path)
    assert len(huge) == len("ValueError: ") + LINE_CHARS + len("…") and huge.endswith("…")


@pytest.mark.parametrize("text", [
    "[Errno 2] No such file or directory: '/data/" + "deep/" * 10 + "events.parquet'",
    "JSON parse error: Missing a comma or '}' after an object member. in row 1",
])
def test_paths_and_messages_without_row_data_are_untouched(text):
    assert one_line_of(text) == text


def test_an_error_built_from_an_engines_whole_text_is_cut_too():
    # callers that put str(exc) into a message (not first_line) get the same rule from the error itself
    engine = f"Failed to parse string: '{'z' * 500}' as a scalar of type int64"
    error = DataError(f"cannot convert the frame to Arrow: {engine}")
    assert error.one_line() == f"cannot convert the frame to Arrow: Failed to parse string: '{'z' * QUOTE_CHARS}…' " \
                               "as a scalar of type int64"
    assert str(error) == error.message


def test_a_function_shipped_by_value_is_placed_in_the_users_file(tmp_path: Path, monkeypatch):
    """Engines ship a stage's nested functions by value (cloudpickle, which since 3.1.3 names their code
    "<dynamic-code>"); the error still names the user's file and line, as a worker reports it back."""
    import importlib

    import cloudpickle
    import tblib.pickling_support

    (tmp_path / "shipped_stages").mkdir()
    (tmp_path / "shipped_stages" / "__init__.py").write_text("")
    (tmp_path / "shipped_stages" / "limits.py").write_text(
        "def stage(limit):\n"
        "    def per_partition(rows):\n"
        "        if len(rows) > limit:\n"
        "            raise ValueError(f'{len(rows)} rows, more than {limit}')\n"
        "        return rows\n"
        "    return per_partition\n")
    monkeypatch.chdir(tmp_path)  # where a file named "<dynamic-code>" would seem to be
    monkeypatch.syspath_prepend(str(tmp_path))
    shipped = cloudpickle.loads(cloudpickle.dumps(importlib.import_module("shipped_stages.limits").stage(1)))
    tblib.pickling_support.install()
    try:
        shipped([1, 2])
    except ValueError as raised:
        returned = pickle.loads(pickle.dumps(raised))  # the traceback as it comes back from a worker
    assert describe_user_error(returned, tmp_path) == \
        "ValueError: 2 rows, more than 1 (shipped_stages/limits.py:4 in per_partition)"


def test_a_java_error_through_py4j_is_told_by_the_java_exceptions_line_not_py4js():
    # str() of a Py4JJavaError, as a Spark read whose filesystem class is missing raised it
    said = ("An error occurred while calling o89.parquet.\n: java.lang.RuntimeException: java.lang."
            "ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem not found\n\tat org.apache.hadoop")
    assert first_line(RuntimeError(said)) == ("java.lang.RuntimeException: java.lang.ClassNotFoundException: "
                                              "Class org.apache.hadoop.fs.s3a.S3AFileSystem not found")
    assert first_line(RuntimeError("An error occurred while calling o89.parquet.")) == (
        "An error occurred while calling o89.parquet.")  # nothing after it: kept
