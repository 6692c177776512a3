"""Google Cloud Storage as a store (gs://), against a real emulator (fake-gcs-server on 127.0.0.1):
generation preconditions refuse a second create-only write and a stale compare-and-swap, a write that
meets its own earlier one is recognised as ours, trees of files go up, down and are listed, copied and
deleted, the store check trusts it and keeps its answer, and a Spark stage on a gs:// workdir is
refused in one line (exit 69). The pipeline suite on every engine runs on it too (test_s3_workdir.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.data.objectstore import Conflict
from hybridflow.data.storage import object_path, settings_for
from tests.support import gcsserver

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    reason = gcsserver.missing_reason()
    if reason:
        pytest.skip(reason)
    server = gcsserver.GcsServer(tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log").start()
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
  spark: {master: "local[1]"}
stages:
  make: {run: "mypkg.steps:make", backend: spark, outputs: [a]}
'''


def test_a_spark_stage_on_a_gs_workdir_is_refused_in_one_line(project, gcs, tmp_path):
    project.stages("import pandas as pd\n\n\ndef make():\n    return pd.DataFrame({\"a\": [1, 2]})\n")
    project.pipeline(SPARK_PIPELINE)
    environ = {**os.environ, **gcs.env(), "HYBRIDFLOW_CACHE": str(tmp_path / "cache"), "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml"], cwd=project.root,
                          env=environ, capture_output=True, text=True, timeout=240)
    assert done.returncode == 69, done.stdout + done.stderr
    assert "Spark does not reach gs:// paths yet" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert not Path(project.root / ".hybridflow").exists()
