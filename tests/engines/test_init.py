"""`hybridflow init` makes a project that validates and runs at once, on the engines asked for; its
own test passes; a directory that is not empty is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.backends import BUILT_IN

ROOT = Path(__file__).resolve().parents[2]


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_new_python_project_validates_runs_and_passes_its_own_test(tmp_path):
    made = cli(tmp_path, "init", "churn-model")
    assert made.returncode == 0, made.stderr
    project = tmp_path / "churn-model"
    assert {p.name for p in project.iterdir()} >= {"pipeline.yaml", "stages", "data", "tests", "README.md"}
    assert cli(project, "validate", "pipeline.yaml").returncode == 0
    ran = cli(project, "run", "pipeline.yaml")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "skip" in cli(project, "plan", "pipeline.yaml").stdout  # the second time: nothing to do
    own = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=project,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert own.returncode == 0, own.stdout + own.stderr
    refused = cli(tmp_path, "init", "churn-model")
    assert refused.returncode == 2 and "is not empty" in refused.stderr
    wrong = cli(tmp_path, "init", "other", "--engines", "sparkk")
    assert wrong.returncode == 2 and f"--engines takes some of {', '.join(BUILT_IN)}" in wrong.stderr


@pytest.mark.timeout(600)
def test_a_project_on_every_engine_runs(tmp_path):
    # each engine's example stage keeps the columns it read, so they chain in any order
    assert cli(tmp_path, "init", "all", "--engines", "duckdb,spark,polars,dask,ray").returncode == 0
    project = tmp_path / "all"
    text = (project / "pipeline.yaml").read_text()
    assert all(f"backend: {engine}" in text for engine in BUILT_IN)
    ran = cli(project, "run", "pipeline.yaml")
    assert ran.returncode == 0, ran.stdout + ran.stderr
