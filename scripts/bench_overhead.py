"""What hybridflow adds to a stage beyond the user's function: a chain of N trivial python stages
(each returns a three-row frame built from its input), run end to end through the CLI, twice (the
second run skips every stage). Prints the wall time of each run, the time per stage, and, from the
run's timeline, each step's share: reading inputs, the function, publishing (check, hash, manifest,
fsync, commit), and what is left of an attempt (engine, GPU choice, fingerprint, records).

    python scripts/bench_overhead.py            # 50 stages
    python scripts/bench_overhead.py --stages 200
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

STAGE = '''
import pandas as pd


def first():
    return pd.DataFrame({"x": [1, 2, 3]})


def step(**inputs):
    [previous] = inputs.values()
    return previous.assign(x=previous.x + 1)
'''


def pipeline(stages: int) -> str:
    lines = ["name: overhead", "stages:", '  s0: {run: "benchstages:first", outputs: [d0]}']
    lines += [f'  s{i}: {{run: "benchstages:step", inputs: [d{i - 1}], outputs: [d{i}]}}' for i in range(1, stages)]
    return "\n".join(lines) + "\n"


def timed_run(project: Path) -> float:
    clock = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml"], cwd=project,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the run failed:\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hybridflow-overhead-") as scratch:
        project = Path(scratch)
        (project / "benchstages.py").write_text(STAGE)
        (project / "pipeline.yaml").write_text(pipeline(args.stages))
        full = timed_run(project)
        skipped = timed_run(project)
        from hybridflow.store.state import RunStore

        store = RunStore(project / ".hybridflow" / "runs.db")
        first_run = store.runs(limit=2)[-1]
        steps: dict[str, list[float]] = defaultdict(list)
        for span in store.spans(first_run["run_id"]):
            steps[span["kind"]].append(span["ended_at"] - span["started_at"])
    n = args.stages
    print(f"{n} trivial python stages, end to end through the CLI")
    print(f"  all run:      {full:6.2f} s   {full / n * 1000:6.1f} ms per stage")
    print(f"  all skipped:  {skipped:6.2f} s   {skipped / n * 1000:6.1f} ms per stage")
    attempt = statistics.mean(steps["attempt"]) if steps["attempt"] else 0.0
    print("  per stage, from the run's timeline (mean):")
    for kind in ("read inputs", "function", "publish"):
        if steps[kind]:
            per_stage = sum(steps[kind]) / n  # publish has two spans per stage: write and commit
            print(f"    {kind:12s} {per_stage * 1000:7.1f} ms  ({per_stage / attempt:.0%} of an attempt)")
    print(f"    {'attempt':12s} {attempt * 1000:7.1f} ms  (engine, device, reading, calling, publishing)")
    print(f"  ratio to the target of 5 s for 50 stages: {full / (5.0 * n / 50):.2f}")


if __name__ == "__main__":
    main()
