"""The driver JVM's class-data archive, on a real Spark: the first session on a machine writes it as its
JVM exits, whole and in place (nothing half-written left, an abandoned one of a killed run dropped);
every later session maps it (read from the JVM's own memory map while the stage runs); a pipeline
that sets its own -Xshare option gets none of ours; one the JVM refuses is dropped; a stage whose
work was cancelled (its timeout) ends its JVM without waiting to write one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

STAGES = '''
import time


def make(ctx):
    from pyspark import SparkContext

    with open(f"/proc/{SparkContext._gateway.proc.pid}/maps") as maps:
        mapped = any("spark-class-data" in line and line.rstrip().endswith(".jsa") for line in maps)
    return ctx.spark.range(50).selectExpr("id", f"{mapped} AS mapped")


def slow(ctx, numbers):
    return numbers.selectExpr("id", "reflect('java.lang.Thread', 'sleep', cast(60000 as bigint)) AS waited")
'''

PIPELINE = """
name: classes
stages:
  make: {{run: "steps:make", backend: spark, outputs: [numbers]}}
{more}
backends:
  spark:
    master: "local[1]"
{conf}
"""


def run(root: Path, jars: Path, *, more: str = "", conf: str = "") -> subprocess.CompletedProcess:
    (root / "pipeline.yaml").write_text(PIPELINE.format(more=more, conf=conf))
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml", "--force"], cwd=root,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HYBRIDFLOW_JARS": str(jars), "COLUMNS": "200"})


def mapped(root: Path) -> bool:
    dataset = root / ".hybridflow" / "classes" / "datasets" / "numbers"
    current = json.loads((dataset / "CURRENT").read_text())["version"]
    values = {value for file in (dataset / "versions" / current).glob("*.parquet")
              for value in pq.read_table(file).column("mapped").to_pylist()}
    assert len(values) == 1, values
    return values.pop()


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "flow"
    root.mkdir()
    (root / "steps.py").write_text(STAGES)
    return root


def test_the_first_session_writes_the_archive_and_every_later_one_maps_it(project, tmp_path):
    jars = tmp_path / "jars"
    folder = jars / "spark-class-data"
    folder.mkdir(parents=True)
    abandoned = folder / "0123456789abcdef01234567.4242-dead.writing"  # a killed run's, two hours ago
    abandoned.write_bytes(b"\xa8\xab\x0b\xf0 half")
    os.utime(abandoned, (time.time() - 7200, time.time() - 7200))

    first = run(project, jars)
    assert first.returncode == 0, first.stdout + first.stderr
    assert mapped(project) is False
    archives = sorted(folder.iterdir())
    assert [path.suffix for path in archives] == [".jsa"], archives  # whole, in place; the abandoned one gone
    assert archives[0].read_bytes()[:4] == b"\xa8\xab\x0b\xf0" and archives[0].stat().st_size > 10_000_000

    second = run(project, jars)
    assert second.returncode == 0, second.stdout + second.stderr
    assert mapped(project) is True
    assert sorted(folder.iterdir()) == archives

    own = run(project, jars, conf='    conf: {spark.driver.extraJavaOptions: "-Xshare:auto -Xss4m"}')
    assert own.returncode == 0, own.stdout + own.stderr
    assert mapped(project) is False
    assert sorted(folder.iterdir()) == archives

    # an archive the JVM refuses (here: its header overwritten) is dropped, for the next session to write anew
    archives[0].chmod(0o644)
    with open(archives[0], "r+b") as archive:
        archive.seek(4)
        archive.write(b"\0" * 64)
    refused = run(project, jars)
    assert refused.returncode == 0, refused.stdout + refused.stderr
    assert mapped(project) is False
    assert list(folder.iterdir()) == []


def test_a_cancelled_session_does_not_wait_to_write_an_archive(project, tmp_path):
    jars = tmp_path / "jars"
    timed_out = run(project, jars, more='  slow: {run: "steps:slow", backend: spark, inputs: [numbers], '
                                        'outputs: [late], timeout: 3}')
    assert timed_out.returncode == 124, timed_out.stdout + timed_out.stderr
    assert "stage 'slow' timed out after 3" in timed_out.stderr, timed_out.stderr
    assert list((jars / "spark-class-data").iterdir()) == []
