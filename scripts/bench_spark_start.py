"""Spark's start with and without the driver JVM's class-data archive (backends/spark/classdata.py).

A one-stage pipeline (a Spark stage that writes 100,000 rows from a small aggregation) runs as
`hybridflow run --force` in a fresh process, in interleaved rounds: (a) as users get it, mapping the
archive the first run wrote, (b) with the pipeline's own `-Xshare:auto` option, which turns ours off
and leaves the JVM its default (the JDK's base archive only). Each is timed as a whole process, wall
time and CPU time (the process and every child it waited for: the driver JVM is one). One untimed
run of each comes first; the first one writes the archive into a fresh jar cache, timed apart (what
a first run on a new machine pays once). Prints every round and the medians' ratios (a)/(b). Wrap it
in `flock /tmp/hf-heavy.lock` on a shared machine.

    python scripts/bench_spark_start.py              # 5 rounds
    python scripts/bench_spark_start.py --rounds 9
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGE = '''
from pyspark.sql import functions as F


def make(ctx):
    numbers = ctx.spark.range(100_000)
    return numbers.withColumn("bucket", F.col("id") % 10).withColumn("twice", F.col("id") * 2)
'''

PIPELINE = """
name: sparkstart
stages:
  make: {{run: "steps:make", backend: spark, outputs: [numbers]}}
backends:
  spark:
    master: "local[2]"
{conf}
"""

OURS_OFF = '    conf: {spark.driver.extraJavaOptions: "-Xshare:auto"}'


def timed(root: Path, pipeline: str, jars: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one `hybridflow run` process (CPU: it and the children it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", pipeline, "--force"], cwd=root,
                          capture_output=True, text=True, env={**os.environ, "HYBRIDFLOW_JARS": str(jars)})
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"hybridflow run {pipeline} failed:\n{done.stdout}\n{done.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hf-bench-spark-start-") as scratch:
        root, jars = Path(scratch) / "flow", Path(scratch) / "jars"
        root.mkdir()
        (root / "steps.py").write_text(STAGE)
        (root / "archive.yaml").write_text(PIPELINE.format(conf=""))
        (root / "plain.yaml").write_text(PIPELINE.format(conf=OURS_OFF))
        wall, cpu = timed(root, "archive.yaml", jars)
        archives = list((jars / "spark-class-data").glob("*.jsa"))
        print(f"first run, writing the archive: {wall:.1f} s wall, {cpu:.1f} s CPU; "
              f"archive {sum(a.stat().st_size for a in archives) / 2**20:.0f} MiB")
        timed(root, "plain.yaml", jars)
        results: dict[str, list[tuple[float, float]]] = {"archive": [], "plain": []}
        for number in range(args.rounds):
            order = ["archive", "plain"] if number % 2 == 0 else ["plain", "archive"]
            for name in order:
                results[name].append(timed(root, f"{name}.yaml", jars))
            print(f"round {number + 1}: " + ", ".join(
                f"{name} {results[name][-1][0]:.1f} s wall {results[name][-1][1]:.1f} s CPU" for name in order))
    wall = {name: statistics.median(w for w, _ in runs) for name, runs in results.items()}
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in results.items()}
    print(f"median: with the archive {wall['archive']:.1f} s wall, {cpu['archive']:.1f} s CPU; "
          f"without {wall['plain']:.1f} s, {cpu['plain']:.1f} s")
    print(f"ratio with/without: wall {wall['archive'] / wall['plain']:.2f}, CPU {cpu['archive'] / cpu['plain']:.2f}")


if __name__ == "__main__":
    main()
