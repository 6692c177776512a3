"""Benchmark: what a re-run of the weekly retrain costs when nothing, or one week, changed.

    python scripts/bench_incremental.py                   # 160,000 customers x 12 weeks (~13M events)
    python scripts/bench_incremental.py --customers 40000 # quicker

In a scratch copy of the example it measures, through the CLI:
  1. the full pipeline, from nothing;
  2. the same pipeline again, unchanged: every stage skipped, no engine started (target < 2 s);
  3. after appending one week of raw events: the ETL stage, incremental (only the new deliveries);
  4. the same ETL over all the data (--force), for comparison (target: 3 at most a quarter of 4).
Stage times exclude the engine's start-up, which both ETL runs pay alike; it is printed apart.
A fresh JVM's first Spark jobs cost a few seconds whatever the data, so the incremental ratio is
only meaningful once a week of data takes longer than that (about 0.47 at 40,000 customers, 0.23
at 160,000 on a 2-core machine).
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PIPELINE = "configs/weekly_retrain.yaml"


def cli(project: Path, *args: str) -> float:
    clock = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", PIPELINE, *args], cwd=project,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - clock
    if done.returncode != 0:
        sys.exit(f"run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return seconds


def last_stages(project: Path) -> dict[str, dict]:
    db = sqlite3.connect(project / ".hybridflow" / "runs.db")
    db.row_factory = sqlite3.Row
    run = db.execute("SELECT run_id FROM runs ORDER BY started_at DESC, rowid DESC LIMIT 1").fetchone()["run_id"]
    return {r["stage"]: dict(r) for r in db.execute("SELECT * FROM stages WHERE run_id = ?", [run])}


def etl_seconds(project: Path) -> tuple[float, float, str]:
    etl = last_stages(project)["etl"]
    return etl["duration"] - (etl["engine_start"] or 0.0), etl["engine_start"] or 0.0, etl["skip_reason"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--customers", type=int, default=160_000)
    parser.add_argument("--weeks", type=int, default=12)
    parser.add_argument("--keep", action="store_true", help="keep the scratch project")
    args = parser.parse_args()
    project = Path(tempfile.mkdtemp(prefix="hybridflow-bench-"))
    try:
        for part in ("configs", "stages", "scripts"):
            shutil.copytree(REPO / part, project / part)
        generate = [sys.executable, "scripts/generate_retrain_data.py", "--customers", str(args.customers)]
        subprocess.run([*generate, "--weeks", str(args.weeks)], cwd=project, check=True, capture_output=True)
        few_trials = ("--param", "num_samples=2")

        full = cli(project, *few_trials)
        again = cli(project, *few_trials)
        stages = last_stages(project)
        skipped = all(s["status"] == "skipped" for s in stages.values())
        engines = [s["stage"] for s in stages.values() if s["engine_start"] is not None]

        subprocess.run([*generate, "--append-week"], cwd=project, check=True, capture_output=True)
        cli(project, *few_trials, "--only", "etl")
        incremental, start_inc, reason = etl_seconds(project)
        cli(project, *few_trials, "--only", "etl", "--force", "etl")
        whole, start_full, _ = etl_seconds(project)
    finally:
        if not args.keep:
            shutil.rmtree(project, ignore_errors=True)

    print(f"weekly retrain, {args.customers:,} customers x {args.weeks} weeks (+1 appended)")
    print(f"{'measure':<44} {'seconds':>8} {'ratio':>7}")
    print(f"{'full pipeline, first run':<44} {full:8.2f} {1:7.3f}")
    print(f"{'unchanged second run (CLI wall time)':<44} {again:8.2f} {again / full:7.3f}"
          f"   every stage skipped: {skipped}; engines started: {engines or 'none'}; target < 2 s")
    print(f"{'ETL over all 13 weeks (--force)':<44} {whole:8.2f} {1:7.3f}   + Spark start {start_full:.1f}s")
    print(f"{'ETL incremental after appending a week':<44} {incremental:8.2f} {incremental / whole:7.3f}"
          f"   + Spark start {start_inc:.1f}s; target <= 0.25")
    print(f"  ({reason})")


if __name__ == "__main__":
    main()
