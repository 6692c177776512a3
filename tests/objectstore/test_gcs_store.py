"""Google Cloud Storage as a store (gs://), against a real emulator (fake-gcs-server on 127.0.0.1):
generation preconditions refuse a second create-only write and a stale compare-and-swap, a write that
meets its own earlier one is recognised as ours, trees of files go up, down and are listed, copied and
deleted, the store check trusts it and keeps its answer, and Spark reads and writes it through Google's
connector. The pipeline suite on every other engine runs on it too (test_s3_workdir.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hybridflow.data.objectstore import Conflict
from hybridflow.data.storage import object_path, settings_for
from tests.support.s3stores import start_store

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    server = start_store("fake-gcs", tmp_path_factory.mktemp("gcs"))  # skips, saying why, where it is not installed
    try:
        server.bucket("lake")
        yield server
    finally:
        server.stop()


@pytest.fixture
def objects(gcs, monkeypatch):
    for name, value in gcs.env().items():
        monkeypatch.setenv(name, value)
    return settings_for("gs://lake").objects()


def test_generation_preconditions_refuse_a_second_create_and_a_stale_swap(objects):
    path = object_path("gs://lake/conditions/CURRENT")
    first = objects.write_json(path, {"v": 1}, create_only=True)
    with pytest.raises(Conflict):
        objects.write_json(path, {"v": 2}, create_only=True)
    second = objects.write_json(path, {"v": 3}, if_match=first)
    assert second != first
    with pytest.raises(Conflict):
        objects.write_json(path, {"v": 4}, if_match=first)  # stale: written since
    with pytest.raises(Conflict):
        objects.write_json(object_path("gs://lake/conditions/never"), {"v": 5}, if_match=second)  # gone
    assert objects.read_json(path) == ({"v": 3}, second)


def test_a_conditional_write_that_meets_its_own_earlier_write_is_taken_as_ours(objects):
    # what a retried request whose first answer was lost does: the same bytes again, the condition failing
    path = object_path("gs://lake/lost/LEASE")
    made = objects.write_json(path, {"holder": "run-1"}, create_only=True)
    assert objects.write_json(path, {"holder": "run-1"}, create_only=True) == made
    swapped = objects.write_json(path, {"holder": "run-1", "n": 2}, if_match=made)
    assert objects.write_json(path, {"holder": "run-1", "n": 2}, if_match=made) == swapped


def test_trees_go_up_and_down_and_are_listed_copied_and_deleted(objects, tmp_path):
    local = tmp_path / "tree"
    (local / "part=a").mkdir(parents=True)
    (local / "part=a" / "f.bin").write_bytes(b"x" * 3000)
    (local / "top.txt").write_text("hello")
    remote = object_path("gs://lake/trees/v1")
    objects.upload(local, remote)

    listed = objects.listing(remote)
    assert [(str(p), size) for p, size, _ in listed] == [("lake/trees/v1/part=a/f.bin", 3000),
                                                          ("lake/trees/v1/top.txt", 5)]
    assert all(p.uri.startswith("gs://lake/trees/v1/") and tag for p, _, tag in listed)
    assert objects.children(remote) == ["part=a", "top.txt"]
    assert objects.text(remote / "top.txt") == "hello" and objects.text(remote / "nothing") is None
    assert objects.age(remote / "top.txt") >= 0 and objects.seconds_since_written(remote) >= 0

    copied = object_path("gs://lake/trees/v2")
    objects.copy([(p, copied / p.relative_to(remote).as_posix()) for p in objects.files(remote)], copied)
    back = tmp_path / "back"
    objects.download(objects.files(copied), copied, back)
    assert (back / "part=a" / "f.bin").read_bytes() == b"x" * 3000 and (back / "top.txt").read_text() == "hello"

    objects.delete_tree(remote)
    assert objects.files(remote) == [] and not objects.exists(remote / "top.txt")
    assert len(objects.files(copied)) == 2


def test_a_bucket_that_does_not_exist_is_one_line_naming_it(objects):
    from hybridflow.errors import DataError

    with pytest.raises(DataError, match="the bucket 'nowhere' of gs://nowhere/x does not exist"):
        objects.files(object_path("gs://nowhere/x"))


def test_the_store_check_trusts_gcs_and_keeps_its_answer_in_the_workdir(objects, gcs):
    from hybridflow.store import storecheck

    workdir = object_path("gs://lake/checked")
    assert storecheck.probe(objects, workdir) == []
    storecheck.require_trusted(objects, workdir)
    kept = json.loads(gcs.get_bytes("lake/checked/.hybridflow/store-check.json"))
    assert kept[gcs.endpoint]["honoured"] is True
    assert [k for k in gcs.keys("lake/checked/") if "store-probe" in k] == []


SPARK_PIPELINE = '''
name: sparky
workdir: gs://lake/sparky
backends:
  spark: {master: "local[1]", conf: {spark.sql.shuffle.partitions: 2}}
datasets:
  orders:
    path: gs://lake/sparky-in/orders
  totals:
    checks:   # measured by Spark's workers in the store, as its write job runs (distinct keys: a second job)
      - unique: [customer]
      - unique: [orders]
        on_fail: warn
      - accepted_values: {column: customer, values: [c0, c1, c2, c3, c4, c5]}
        on_fail: warn
      - row_count: {min: 7}
stages:
  totals: {run: "mypkg.steps:totals", backend: spark, inputs: [orders], outputs: [totals]}
  ranked: {run: "mypkg.steps:ranked", inputs: [totals], outputs: [ranked]}
'''
SPARK_STAGES = '''
def totals(orders):
    from pyspark.sql import functions as F

    return orders.groupBy("customer").agg(F.sum("amount").alias("total"), F.count("*").alias("orders"))


def ranked(totals):
    return totals.sort_values(["total", "customer"], ascending=[False, True]).reset_index(drop=True)
'''


def test_a_spark_stage_reads_and_writes_gs_through_the_gcs_connector_and_a_rerun_skips(project, gcs, tmp_path,
                                                                                       monkeypatch):
    """Spark reads an input in gs:// and writes its output into the gs:// workdir itself (Google's
    connector, fetched on first need); a python stage reads what Spark wrote; the next run skips both."""
    import pandas as pd
    import pyarrow as pa

    import hybridflow
    from tests.objectstore.test_s3_workdir import statuses

    orders = pd.DataFrame({"customer": [f"c{i % 7}" for i in range(500)], "amount": [i * 0.25 for i in range(500)]})
    for part in range(2):  # two files: Spark reads both
        half = orders.iloc[part * 250:(part + 1) * 250]
        gcs.put_table(f"lake/sparky-in/orders/part-{part}.parquet", pa.Table.from_pandas(half, preserve_index=False))
    project.stages(SPARK_STAGES)
    file = project.pipeline(SPARK_PIPELINE)
    environ = {**os.environ, **gcs.env(), "HYBRIDFLOW_CACHE": str(tmp_path / "cache"), "COLUMNS": "400"}

    def run() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml"], cwd=project.root,
                              env=environ, capture_output=True, text=True, timeout=280)

    done = run()
    assert done.returncode == 0, done.stdout + done.stderr
    assert statuses(done.stdout) == {"totals": "done", "ranked": "done"}, done.stdout
    written = [key for key in gcs.keys("lake/sparky/") if "/datasets/totals/" in key and key.endswith(".parquet")]
    assert written, gcs.keys("lake/sparky/")  # Spark's own files, in the store
    [manifest] = [key for key in gcs.keys("lake/sparky/sparky/datasets/totals/") if key.endswith("_manifest.json")]
    checks = {c["check"]: (c["status"], c["failing"]) for c in json.loads(gcs.get_bytes(manifest))["checks"]}
    assert checks == {"unique_customer": ("passed", 0), "unique_orders": ("warned", 5),  # 7 customers: 72 or 71
                      "accepted_values_customer": ("warned", 1), "row_count": ("passed", None)}
    assert not (project.root / ".hybridflow").exists()

    for name, value in gcs.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    got = hybridflow.read(file, "ranked", engine="arrow").to_pandas()
    expected = (orders.groupby("customer", as_index=False).agg(total=("amount", "sum"), orders=("amount", "size"))
                .sort_values(["total", "customer"], ascending=[False, True]).reset_index(drop=True))
    pd.testing.assert_frame_equal(got[["customer", "total", "orders"]], expected, check_dtype=False)

    again = run()
    assert again.returncode == 0, again.stdout + again.stderr
    assert statuses(again.stdout) == {"totals": "skipped", "ranked": "skipped"}, again.stdout

    checked = subprocess.run([sys.executable, "-m", "hybridflow.cli", "doctor", "pipeline.yaml"], cwd=project.root,
                             env=environ, capture_output=True, text=True, timeout=120)
    assert "bucket lake answers at" in checked.stdout, checked.stdout + checked.stderr
    assert "spark and gs://" in checked.stdout and "gcs-connector-" in checked.stdout, checked.stdout
