"""Data checks of an output in a workdir in object storage (a real S3 server, moto, on 127.0.0.1): the
engine's workers measure the version they wrote there, per partition, and an error-level check
publishes nothing there: the previous version stays current and no other version is left."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from hybridflow.data.stores.s3 import S3Settings
from hybridflow.definition.config import load_pipeline
from hybridflow.errors import ExitCode
from hybridflow.execution.runner import Runner
from tests.objectstore.test_s3_workdir import current_versions
from tests.support.engines import start_engines

pytestmark = pytest.mark.timeout(900)

S3_BUCKETS = ("checked",)  # made when the s3 fixture (conftest.py) starts its server

PIPELINE = """
name: s3checks
workdir: s3://checked/team
datasets:
  events: {path: "s3://checked/raw", partition_by: [delivery_week],
           schema: {delivery_week: string, id: int64, plan: string}}
  weeks:
    partition_by: [delivery_week]
    checks:
      - accepted_values: {column: plan, values: [free, pro, team]}
      - row_count_change: {max_drop: 0.5}
stages:
  copy: {run: "mypkg.steps:same", backend: dask, inputs: [events], outputs: [weeks]}
"""


def deliver(s3, value: str, plans: list[str]) -> None:
    s3.put_table(f"checked/raw/delivery_week={value}/part-0.parquet",
                 pa.table({"id": list(range(len(plans))), "plan": plans}))


def manifest(s3, version: str) -> dict:
    key = f"team/s3checks/datasets/weeks/versions/{version}/_manifest.json"
    return json.loads(s3.client().get_object(Bucket="checked", Key=key)["Body"].read())


def test_checks_of_an_s3_output_run_on_the_engines_workers_and_a_failure_publishes_nothing(
        project, s3, tmp_path, monkeypatch):
    from distributed import get_task_stream

    for name, value in {**s3.env(), "HYBRIDFLOW_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(name, value)  # the engine's workers reach the store as a user's would
    project.stages("def same(events):\n    return events\n")
    path = project.pipeline(PIPELINE)
    deliver(s3, "2026-11-09", ["free", "pro", "team"])
    deliver(s3, "2026-11-16", ["pro", "pro", "free"])
    (tmp_path / "engine-logs").mkdir()
    engines = start_engines(tmp_path / "engine-logs", ["python", "dask"], code=[project.root / "mypkg"],
                            store=S3Settings.of())
    try:
        with get_task_stream(client=engines["dask"].client) as tasks:
            first = Runner(load_pipeline(path), engines=engines).run()
        assert first.status == "success", first.error
        measured = [t for t in tasks.data if "_check_partials" in str(t["key"])]  # a key may be a tuple
        assert measured and all(t["worker"] for t in measured)  # measured where the data is, not here

        deliver(s3, "2026-11-16", ["pro", "gold"])  # a redelivery with a plan no one sells
        failed = Runner(load_pipeline(path), engines=engines).run()
    finally:
        for engine in engines.values():
            engine.stop()

    [version] = current_versions(s3, "checked/team/s3checks").values()
    published = manifest(s3, version)
    assert published["partition_rows"] == {"delivery_week=2026-11-09": 3, "delivery_week=2026-11-16": 3}
    assert {(c["partition"], c["check"], c["status"]) for c in published["checks"]} == {
        (p, c, "passed") for p in published["partition_rows"] for c in ("accepted_values_plan", "row_count_change")}

    assert failed.status == "failed" and failed.error.exit_code == ExitCode.DATA
    assert ("dataset 'weeks', partition delivery_week=2026-11-16: check 'accepted_values_plan' (accepted_values) "
            "failed: 1 of 2 rows fail") in failed.stages["copy"].error
    recorded = {(c["partition"], c["check"]): c for c in failed.stages["copy"].checks["weeks"]}
    assert recorded[("delivery_week=2026-11-16", "row_count_change")]["value"] == \
        {"rows": 2, "previous": 3, "ratio": round(2 / 3, 4)}
    assert current_versions(s3, "checked/team/s3checks") == {"weeks": version}  # the previous version stays
    left = {k.split("/versions/")[1].split("/")[0] for k in s3.keys("checked/team/s3checks/datasets/weeks/versions/")}
    assert left == {"", version}  # nothing of the failed run is left there, not even a "directory" object
