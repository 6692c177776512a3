"""Checks of an external input that its Parquet footers answer (row counts; freshness from the max
statistics) are judged before any engine is started for the stage that reads it: a failed one starts
no Spark at all, not even early. The outcomes are the ones the engine path records, to the message;
where the files have no statistics the stage's engine runs the checks as before."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.definition.config import load_pipeline
from hybridflow.errors import ExitCode
from hybridflow.execution.runner import Runner
from hybridflow.reporting.timeline import ENGINE_START
from hybridflow.results import RunOptions
from hybridflow.store.state import RunStore

STAGES = '''
def same(events):
    return events


def keep(accounts):
    return accounts
'''

PIPELINE = '''
name: {name}
datasets:
  events:
    path: raw/{name}
    checks:
      - row_count: {{min: {least}}}
      - freshness: {{column: event_time, max_age: 8d}}
      - freshness: {{column: paris_time, max_age: 2d}}
        name: fresh_in_paris
        on_fail: warn
      - row_count_change: {{max_drop: 0.5}}
stages:
  copy: {{run: "mypkg.steps:same", backend: {engine}, inputs: [events], outputs: [weeks]}}
'''

MOMENT = dt.datetime(2026, 11, 27, 9, 0, tzinfo=dt.timezone.utc)  # the time the runs are for
OLD = dt.datetime(2026, 11, 10, 6, 30, 15, 123456)
DELIVERY = pa.table({
    "id": pa.array([1, 2, 3], pa.int64()),
    "event_time": pa.array([OLD - dt.timedelta(days=3), OLD, None], pa.timestamp("us")),
    # a zone and a unit of its own: judged and shown as the column's values are, in Paris
    "paris_time": pa.array([OLD, OLD + dt.timedelta(days=1), OLD - dt.timedelta(days=1)],
                           pa.timestamp("ms", tz="Europe/Paris")),
})


def deliver(project, name: str, statistics: bool) -> None:
    folder = project.root / "raw" / name
    folder.mkdir(parents=True, exist_ok=True)
    # two row groups: the newest value is the largest of their statistics
    pq.write_table(DELIVERY, folder / "part-0.parquet", row_group_size=2, write_statistics=statistics)


def run(project, name: str, engine: str, least: int, statistics: bool = True):
    deliver(project, name, statistics)
    path = project.pipeline(PIPELINE.format(name=name, engine=engine, least=least), f"{name}.yaml")
    result = Runner(load_pipeline(path), RunOptions(scheduled_for=MOMENT)).run()
    started = [s["detail"] for s in RunStore(project.root / ".hybridflow" / "runs.db").spans(result.run_id)
               if s["kind"] == ENGINE_START]
    return result, started


@pytest.fixture
def checked(project):
    project.stages(STAGES)
    return project


def test_a_failed_footer_check_starts_no_spark_and_records_what_the_engine_would(checked):
    footers, started = run(checked, "footers", "spark", least=5)
    assert footers.status == "failed"
    assert started == []  # no JVM: neither early nor for the stage
    stage = footers.stages["copy"]
    assert stage.status == "failed" and footers.error.exit_code == ExitCode.DATA
    assert "dataset 'events': check 'row_count' (row_count) failed: 3 rows (expected at least 5)" in stage.error

    # the same delivery without statistics: the stage's engine measures it, with the same outcomes
    engine, started = run(checked, "engine", "python", least=5, statistics=False)
    assert started == ["python"] and engine.stages["copy"].status == "failed"
    assert footers.stages["copy"].checks["events"] == engine.stages["copy"].checks["events"]
    assert stage.error == engine.stages["copy"].error
    by_check = {c["check"]: c for c in stage.checks["events"]}
    assert by_check["freshness_event_time"]["value"] == "2026-11-10T06:30:15.123456+00:00"
    assert by_check["fresh_in_paris"]["value"] == "2026-11-11T07:30:15.123000+01:00"
    assert [c["status"] for c in stage.checks["events"]] == ["failed", "failed", "warned", "passed"]


KEEP_GOING = '''
name: going
datasets:
  events: {path: raw/going, checks: [row_count: {min: 5}]}
  accounts: {path: raw/accounts, checks: [row_count: {min: 1}, freshness: {column: event_time, max_age: 30d}]}
  weeks: {}
stages:
  copy: {run: "mypkg.steps:same", backend: spark, inputs: [events], outputs: [weeks]}
  keep: {run: "mypkg.steps:keep", backend: python, inputs: [accounts], outputs: [kept]}
'''


def test_with_keep_going_the_other_stages_run_and_only_their_engines_start(checked):
    deliver(checked, "going", statistics=True)
    deliver(checked, "accounts", statistics=True)
    result = Runner(load_pipeline(checked.pipeline(KEEP_GOING, "going.yaml")),
                    RunOptions(keep_going=True, scheduled_for=MOMENT)).run()
    assert result.stages["copy"].status == "failed" and result.stages["keep"].status == "done"
    spans = RunStore(checked.root / ".hybridflow" / "runs.db").spans(result.run_id)
    assert [s["detail"] for s in spans if s["kind"] == ENGINE_START] == ["python"]
    assert [(c["check"], c["status"]) for c in result.stages["keep"].checks["accounts"]] == [
        ("row_count", "passed"), ("freshness_event_time", "passed")]
