"""The checks of an external input in object storage (a real S3 server, moto, on 127.0.0.1) answered
from its files' footers, read through the store: a truncated, stale delivery fails its stage before
Spark is started for it, or fetched for (no connector downloaded, no JVM)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from hybridflow.definition.config import load_pipeline
from hybridflow.execution.runner import Runner
from hybridflow.reporting.timeline import ENGINE_START
from hybridflow.results import RunOptions
from hybridflow.store.state import RunStore

pytestmark = pytest.mark.timeout(300)

S3_BUCKETS = ("footed",)  # made when the s3 fixture (conftest.py) starts its server

PIPELINE = """
name: s3footers
datasets:
  events:
    path: s3://footed/raw
    partition_by: [week]
    checks:
      - row_count: {min: 10}
      - freshness: {column: event_time, max_age: 3d}
stages:
  copy: {run: "mypkg.steps:same", backend: spark, inputs: [events], outputs: [weeks]}
"""


def test_a_stale_truncated_s3_delivery_fails_from_its_footers_with_no_engine(project, s3, monkeypatch):
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    newest = dt.datetime(2026, 11, 20, 23, 59, 59, tzinfo=dt.timezone.utc)
    for week, times in {"2026-11-09": [newest - dt.timedelta(days=9)], "2026-11-16": [newest, None]}.items():
        s3.put_table(f"footed/raw/week={week}/part-0.parquet",
                     pa.table({"id": list(range(len(times))),
                               "event_time": pa.array(times, pa.timestamp("ns", tz="UTC"))}))
    project.stages("def same(events):\n    return events\n")
    moment = dt.datetime(2026, 11, 27, 9, 0, tzinfo=dt.timezone.utc)
    result = Runner(load_pipeline(project.pipeline(PIPELINE)), RunOptions(scheduled_for=moment)).run()

    assert result.status == "failed" and result.stages["copy"].status == "failed"
    spans = RunStore(project.root / ".hybridflow" / "runs.db").spans(result.run_id)
    assert [s for s in spans if s["kind"] == ENGINE_START] == []
    assert [(c["check"], c["status"], c["value"]) for c in result.stages["copy"].checks["events"]] == [
        ("row_count", "failed", 3), ("freshness_event_time", "failed", "2026-11-20T23:59:59+00:00")]
    assert "3 rows (expected at least 10)" in result.stages["copy"].error
