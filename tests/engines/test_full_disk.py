"""A full disk is the user's to fix, not a bug: one line naming the directory and the space free,
exit 74, the run recorded as failed where the record can still be written (and marked by the next
run where it could not), nothing of the stage left in versions/ or staging, and the last good output
still current. The project lives on a small tmpfs, which only root can mount."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.store.catalog import Catalog
from tests.support.projects import Project, last_run_record

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None,
                                reason="mounting a small tmpfs needs root (CI runs as root)")

STAGES = '''
import numpy as np
import pandas as pd


def small(rows=3):
    return pd.DataFrame({"a": list(range(rows))})


def big(a):  # about 16 MB of Parquet: more than the disk holds
    rng = np.random.default_rng(0)
    return {"b": pd.DataFrame({f"c{i}": rng.random(200_000) for i in range(10)}), "tiny": a}


def spark_big(ctx):
    return ctx.spark.range(3_000_000).selectExpr("id", "rand() as r", "rand() as s")
'''

PIPELINE = '''
name: full
backends: {spark: {master: "local[1]"}}
stages:
  small: {run: "mypkg.steps:small", backend: python, outputs: [a]}
  big: {run: "mypkg.steps:big", backend: python, inputs: [a], outputs: [tiny, b]}
'''


@pytest.fixture
def small_disk(tmp_path: Path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(disk)], check=True)
    try:
        yield Project(disk)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def run(project: Project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml", *args],
                          cwd=project.root, capture_output=True, text=True, timeout=300)


def assert_one_line_about_space(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 74, result.stdout + result.stderr
    assert "out of disk space writing under" in result.stderr and "MiB free" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "Logging error" not in result.stderr, result.stderr


def leftovers(project: Project) -> list[Path]:
    home = project.home("full")
    staged = [p for p in (home / "staging").rglob("*") if p.is_file()] if (home / "staging").exists() else []
    return staged + sorted((home / "datasets").glob("*/versions/*"))


def test_a_stage_that_fills_the_disk_fails_with_exit_74_and_leaves_nothing(small_disk):
    small_disk.stages(STAGES)
    small_disk.pipeline(PIPELINE)
    result = run(small_disk)
    assert_one_line_about_space(result)
    assert str(small_disk.root) in result.stderr
    run_record, stages = last_run_record(small_disk.root / ".hybridflow")
    assert run_record["status"] == "failed" and "out of disk space" in run_record["error"]
    assert stages["small"]["status"] == "done" and stages["big"]["status"] == "failed"
    # the failed stage's first output was written before its second filled the disk: not kept
    catalog = Catalog(small_disk.home("full"))
    assert catalog.current("tiny") is None and catalog.current("b") is None
    assert [p.parent.parent.name for p in leftovers(small_disk)] == ["a"]  # small's one version only


def test_a_disk_full_before_the_run_starts_is_one_line_and_keeps_the_last_output(small_disk):
    small_disk.stages(STAGES)
    small_disk.pipeline(PIPELINE.replace("  big:", "  # big:"))
    assert run(small_disk).returncode == 0
    good = Catalog(small_disk.home("full")).current("a")
    filler = small_disk.root / "filler"
    with open(filler, "wb") as out:  # every byte of the disk taken
        try:
            while True:
                out.write(b"\0" * 2**20)
        except OSError:
            pass
    result = run(small_disk, "--force", "--param", "small.rows=5")
    assert_one_line_about_space(result)
    assert Catalog(small_disk.home("full")).current("a").id == good.id
    filler.unlink()
    assert run(small_disk).returncode == 0  # the next run records itself (and any run left "running")
    run_record, _ = last_run_record(small_disk.root / ".hybridflow")
    assert run_record["status"] == "success"


@pytest.mark.timeout(300)
def test_a_spark_stage_that_fills_the_disk_fails_with_exit_74(small_disk):
    small_disk.stages(STAGES)
    small_disk.pipeline(PIPELINE.replace('run: "mypkg.steps:small", backend: python',
                                         'run: "mypkg.steps:spark_big", backend: spark').replace("  big:", "  # big:"))
    result = run(small_disk)
    assert_one_line_about_space(result)
    run_record, stages = last_run_record(small_disk.root / ".hybridflow")
    assert run_record["status"] == "failed" and stages["small"]["status"] == "failed"
    assert leftovers(small_disk) == []
