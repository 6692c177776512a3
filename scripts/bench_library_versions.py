"""What reading the library versions of a stage costs a plan (issue 38), in this environment.

The planner builds, once per plan or run, which installed distribution provides each top-level
module (spec.libraries.Libraries: each distribution's top_level.txt, else the first part of each
path in its RECORD), then reads the name and version of those a stage imports. Against
importlib.metadata.packages_distributions(), which parses every path of every RECORD. Prints the
median seconds of each and their ratio (the target: well under 1), and a second stage's extra cost.

    python scripts/bench_library_versions.py
    python scripts/bench_library_versions.py --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import time
from importlib import metadata

from hybridflow.definition.libraries import Libraries
from hybridflow.engines import engine

MODULES = {"pandas", "numpy", "pyarrow", "sklearn", "yaml", "json"}  # what a training stage imports


def timed(work, *args) -> float:
    start = time.perf_counter()
    work(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    first, more, stdlib = [], [], []
    for _ in range(rounds):
        libraries = Libraries()
        first.append(timed(libraries.versions, MODULES, engine("spark").distributions))
        more.append(timed(libraries.versions, MODULES | {"dask"}, engine("dask").distributions))
        stdlib.append(timed(metadata.packages_distributions))
    ours, theirs = statistics.median(first), statistics.median(stdlib)
    print(f"distributions installed: {sum(1 for _ in metadata.distributions())}")
    print(f"first stage of a plan: {ours:.4f}s; each further stage: {statistics.median(more):.4f}s")
    print(f"packages_distributions(): {theirs:.4f}s")
    print(f"ratio ours / packages_distributions: {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
