"""How long the CLI takes to start, against a bare Python start: `hybridflow --help`, `hybridflow
validate` of the five-stage weekly retrain, and a run of it where every stage is skipped (a no-op
rerun). Each command runs in a fresh process, the commands taking turns, and each figure is the
median of --runs runs after one warm-up run (bytecode caches written, as an installed package has
them). Prints each as its difference from and ratio to a bare `python -c pass`, with its target.

    python scripts/bench_cli.py                  # runs configs/weekly_retrain.yaml once first if needed
    python scripts/bench_cli.py --runs 11
    python scripts/bench_cli.py --compare /tmp/before   # git archive <commit> hybridflow | tar -x -C /tmp/before

`--compare DIR` also times, in the same rounds, the three hybridflow commands with the hybridflow
package of another source tree (an older commit's): before and after, side by side.

Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "configs" / "weekly_retrain.yaml"


def hybridflow() -> list[str]:
    """The console script beside this Python (what a user types), else the module."""
    script = shutil.which("hybridflow", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "hybridflow.cli"]


def environment(code: Path | None = None) -> dict[str, str]:
    """This one, with bytecode caches written: without them every run compiles hybridflow's modules;
    with `code`, the hybridflow package under it first on the path."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))
    return env


def seconds(command: list[str], code: Path | None = None) -> float:
    clock = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=environment(code), capture_output=True, text=True)
    elapsed = time.perf_counter() - clock
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed


def ensure_published(pipeline: Path) -> None:
    """A no-op rerun needs a run that published everything: made here unless the plan runs no stage."""
    planned = subprocess.run([*hybridflow(), "plan", str(pipeline)], cwd=ROOT, env=environment(),
                             capture_output=True, text=True)
    if re.search(r"^0 of \d+ stages? to run", planned.stdout, re.MULTILINE):
        return
    print(f"running {pipeline.name} once, so that the next run skips every stage (engines start: minutes)")
    if pipeline == PIPELINE and not (ROOT / "data" / "retrain").exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "generate_retrain_data.py")], check=True)
    subprocess.run([*hybridflow(), "run", str(pipeline)], cwd=ROOT, env=environment(), check=True,
                   stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (median taken)")
    parser.add_argument("--pipeline", type=Path, default=PIPELINE, help="the five-stage pipeline file")
    parser.add_argument("--compare", type=Path, help="a source tree holding another hybridflow package, timed "
                                                     "in the same rounds (before/after)")
    args = parser.parse_args()
    pipeline = args.pipeline.resolve()
    ensure_published(pipeline)
    # name, command, target: (most seconds more than bare Python, or None; most seconds in all, or None)
    commands = [
        ("python -c pass", [sys.executable, "-c", "pass"], (None, None)),
        ("hybridflow --help", [*hybridflow(), "--help"], (0.3, None)),
        (f"hybridflow validate {pipeline.name}", [*hybridflow(), "validate", str(pipeline)], (0.3, None)),
        (f"hybridflow run {pipeline.name} (all skipped)", [*hybridflow(), "run", str(pipeline)], (None, 0.6)),
    ]
    codes = {name: None for name, _, _ in commands}
    if args.compare is not None:
        compared = [(f"{name} (--compare)", command, (None, None)) for name, command, _ in commands[1:]]
        codes.update((name, args.compare.resolve()) for name, _, _ in compared)
        commands += compared
    times: dict[str, list[float]] = {name: [] for name, _, _ in commands}
    for round_ in range(args.runs + 1):  # round 0 warms up: caches written, files in memory
        for name, command, _ in commands:
            elapsed = seconds(command, codes[name])
            if round_:
                times[name].append(elapsed)
    bare = statistics.median(times[commands[0][0]])
    failed = report(commands, times, bare, args.runs)
    sys.exit(1 if failed else 0)


def report(commands, times: dict[str, list[float]], bare: float, runs: int) -> bool:
    """Prints the table; returns whether a target was missed."""
    print(f"median of {runs} runs each, fresh processes ({sys.executable})")
    print(f"{'command':<60} {'median':>8} {'vs bare':>9} {'ratio':>7}  target")
    failed = False
    for name, _, (most_more, most_total) in commands:
        median = statistics.median(times[name])
        if most_more is not None:
            ok, target = median - bare <= most_more, f"+{most_more:.1f} s"
        elif most_total is not None:
            ok, target = median <= most_total, f"{most_total:.1f} s in all"
        else:
            ok, target = True, ""
        verdict = ("PASS" if ok else "FAIL") if target else ""
        failed = failed or not ok
        print(f"{name:<60} {median:>7.3f}s {median - bare:>+8.3f}s {median / bare:>6.1f}x  {target} {verdict}".rstrip())
    return failed


if __name__ == "__main__":
    main()
