"""Wide tables through every engine: one external Parquet input of N columns copied by a stage on
python, spark, dask and ray, at several widths. Prints seconds per run (engines started once,
beforehand) and the seconds per 1,000 columns, which stay about flat when cost is linear in width.

    python scripts/bench_wide.py [--columns 2500,5000,10000] [--rows 1000] [--engines python,spark,dask,ray]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hybridflow import backends  # noqa: E402
from hybridflow.backends.engineoutput import process_output_to  # noqa: E402
from hybridflow.definition.config import load_pipeline  # noqa: E402
from hybridflow.engines.dask import DaskSettings  # noqa: E402
from hybridflow.engines.ray import RaySettings  # noqa: E402
from hybridflow.engines.spark import SparkSettings  # noqa: E402
from hybridflow.execution.runner import Runner  # noqa: E402

SETTINGS = {"python": None, "spark": SparkSettings(master="local[2]"), "dask": DaskSettings(n_workers=1),
            "ray": RaySettings(num_cpus=2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--columns", default="2500,5000,10000")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--engines", default="python,spark,dask,ray")
    args = parser.parse_args()
    widths = [int(w) for w in args.columns.split(",")]
    names = args.engines.split(",")
    root = Path(tempfile.mkdtemp(prefix="bench-wide-"))
    (root / "mypkg").mkdir()
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "steps.py").write_text("def same(events):\n    return events\n")
    (root / "logs").mkdir()
    engines = {}
    for name in names:
        engine = backends.create(name, SETTINGS[name], root / "logs")
        with process_output_to(root / "logs" / "engines.log"):
            engine.start([root / "mypkg"])
        engines[name] = engine
    print(f"{'engine':8} {'columns':>8} {'seconds':>8} {'s per 1k columns':>17}")
    try:
        for width in widths:
            data = root / f"wide-{width}"
            data.mkdir()
            pq.write_table(pa.table({f"c{i}": np.arange(args.rows) + i for i in range(width)}), data / "w.parquet")
            for name in names:
                pipeline = root / f"{name}-{width}.yaml"
                pipeline.write_text(textwrap.dedent(f"""\
                    name: wide-{name}-{width}
                    root: .
                    datasets:
                      events: {{path: {data}}}
                    stages:
                      copy: {{run: "mypkg.steps:same", backend: {name}, inputs: [events], outputs: [copied]}}
                    """))
                started = time.perf_counter()
                result = Runner(load_pipeline(pipeline), engines=engines).run()
                seconds = time.perf_counter() - started
                status = "" if result.status == "success" else f"  {result.status}: {result.error}"
                print(f"{name:8} {width:8} {seconds:8.2f} {seconds / width * 1000:17.2f}{status}", flush=True)
    finally:
        for engine in engines.values():
            engine.stop()


if __name__ == "__main__":
    main()
