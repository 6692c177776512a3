"""What `hybridflow run` shows on the terminal while engines run and fail: hybridflow's own lines,
nothing of the engines'. Their chatter from hybridflow's process (Ray Data's task tracebacks, the
Dask shuffle plugin's records, pyspark's JSON query-context records) goes to the run's engines.log.
Each test runs the command in a subprocess, which starts its own engine as a user's run does."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from hybridflow.errors import ExitCode
from tests.engines.test_bad_inputs import corrupt_dictionary_indices, good_table
from tests.support.projects import Project

STAGES = '''
import pyarrow as pa


def same(events):
    return events


def shuffled(events):  # Dask: a p2p shuffle, whose scheduler plugin logs each one it starts and ends
    return events.assign(k=events["id"] % 7).shuffle("k")


def divided_by_zero(events):  # Spark: fails only when the output is written (ANSI division)
    from pyspark.sql import functions as F

    return events.withColumn("w", F.col("id") / F.lit(0))


def _twice_x(batch):
    return pa.table([batch["id"], batch["v"]], names=["x", "x"])


def duplicate_columns(events):  # Ray: a Dataset whose blocks hold two columns named x
    return events.map_batches(_twice_x, batch_format="pyarrow")
'''


def run_cli(project: Project, backend: str, stage: str, events: str) -> subprocess.CompletedProcess:
    """`hybridflow run` of a one-stage pipeline named <stage>-<backend> reading `events`."""
    project.stages(STAGES)
    project.pipeline(f'''
    name: {stage}-{backend}
    root: .
    datasets:
      events: {events}
    stages:
      {stage}: {{run: "mypkg.steps:{stage}", backend: {backend}, inputs: [events], outputs: [out]}}
    ''')
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml"], cwd=project.root,
                          capture_output=True, text=True, timeout=240)


def engines_log(project: Project, pipeline: str) -> str:
    [log] = (project.home(pipeline) / "runs").glob("*/logs/engines.log")
    return log.read_text()


def parquet_events(project: Project) -> str:
    (project.root / "events").mkdir()
    pq.write_table(good_table(), project.root / "events" / "a.parquet")
    return "{path: events}"


def bad_csv_value(project: Project) -> tuple[str, str]:
    """A bad value at row 400,001: far past the first block hybridflow checks, only Ray meets it."""
    rows = "".join(f"{i},{i}.5\n" for i in range(400_000))
    bad = project.write("raw/events.csv", f"id,amount\n{rows}oops,1.0\n")
    return "{path: raw/events.csv, format: csv, schema: {id: int64, amount: double}}", \
        f"same failed: input 'events' cannot be read: {bad}: "


def damaged_parquet_page(project: Project) -> tuple[str, str]:
    parquet_events(project)
    bad = project.root / "events" / "b.parquet"
    corrupt_dictionary_indices(bad)
    return "{path: events}", f"same failed: input 'events' cannot be read ({bad}): "


@pytest.mark.parametrize("bad_input", [bad_csv_value, damaged_parquet_page], ids=["csv value", "parquet page"])
def test_a_bad_input_read_by_ray_is_one_line_with_no_traceback_on_the_terminal(project, bad_input):
    events, expected = bad_input(project)
    done = run_cli(project, "ray", "same", events)
    terminal = done.stdout + done.stderr
    assert done.returncode == ExitCode.DATA, terminal
    assert expected in terminal, terminal
    assert "Traceback" not in terminal and "ray.data" not in terminal, terminal
    assert "Traceback" in engines_log(project, "same-ray")  # Ray Data's own record of it: kept, not lost


def test_duplicate_column_names_returned_by_a_ray_stage_are_one_data_error(project):
    done = run_cli(project, "ray", "duplicate_columns", parquet_events(project))
    terminal = done.stdout + done.stderr
    assert done.returncode == ExitCode.DATA, terminal
    assert "duplicate_columns failed: the frame has a duplicate column name 'x'" in terminal, terminal
    assert "KeyError" not in terminal and "Traceback" not in terminal, terminal


def test_a_dask_shuffle_prints_nothing_of_dask_on_the_terminal(project):
    done = run_cli(project, "dask", "shuffled", parquet_events(project))
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal
    assert "Shuffle" not in terminal and "INFO" not in terminal and "distributed" not in terminal, terminal


def test_a_spark_stage_failing_at_the_write_is_one_error_line_without_spark_json(project):
    done = run_cli(project, "spark", "divided_by_zero", parquet_events(project))
    terminal = done.stdout + done.stderr
    assert done.returncode == ExitCode.STAGE_FAILED, terminal
    assert '{"ts"' not in terminal and "DataFrameQueryContextLogger" not in terminal, terminal
    # hybridflow's own lines only: the stage's progress line and the summary's error line
    said = [line for line in terminal.splitlines() if "DIVIDE_BY_ZERO" in line]
    assert len(said) == 2 and said[1].startswith("divided_by_zero failed: ArithmeticException: [DIVIDE_BY_ZERO]"), \
        terminal
    assert '"logger": "DataFrameQueryContextLogger"' in engines_log(project, "divided_by_zero-spark")
