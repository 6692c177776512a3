"""Data checks benchmark: what the issue's nine checks add to a stage, on each engine.

For each engine, the "stage" is reading a table of --rows rows (default 5M) and writing it back as
the stage's output (the engine's read and its Parquet write, as a run does); the "checks" are the
nine checks of the issue (not_null, unique, range, accepted_values, row_count, row_count_change,
null_fraction, expr, freshness) measured by the engine over the output it wrote, as a run does before
it commits: the stage is timed alone and then writing as a run does for an output with checks
(measured while written where the engine holds the rows, else over the files it wrote), in turns,
--rounds times (default 3) after one untimed round; prints the medians, the checks' cost (the
difference) and the ratio checks / stage (the target: at most 0.10). The table's rows are in key
order (customer_id, week), as an output sorted by its key is; --shuffle writes them in random order.

    python scripts/bench_checks.py                       # every engine, 5M rows
    python scripts/bench_checks.py --rows 500000 --engines python duckdb
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hybridflow.backends.checkplan import CheckPlan, Published, judge
from hybridflow.data.tables import TableSource
from hybridflow.definition.datachecks import read_checks
from hybridflow.execution.filechecks import measure as files_then_engine
from hybridflow.settings import TARGET_FILE_SIZE
from tests.support.engines import ENGINES, start_engines

CHECKS = [
    {"not_null": ["customer_id", "week"]},
    {"unique": ["customer_id", "week"]},
    {"range": {"column": "events", "min": 0, "max": 100000}},
    {"accepted_values": {"column": "plan", "values": ["free", "pro", "team"]}},
    {"row_count": {"min": 1000}},
    {"row_count_change": {"max_drop": 0.5, "max_growth": 3.0}},
    {"null_fraction": {"column": "device", "max": 0.2}},
    {"expr": "active_days BETWEEN 0 AND 127", "on_fail": "drop", "name": "active_days_bitmask"},
    {"freshness": {"column": "event_time", "max_age": "8d"}},
]


def table(rows: int, shuffle: bool = False) -> pa.Table:
    rng = np.random.default_rng(7)
    order = rng.permutation(rows) if shuffle else np.arange(rows, dtype=np.int64)
    devices = pa.array(rng.choice(["ios", "android", "web"], rows), mask=rng.random(rows) < 0.1)  # 10% unknown
    start = np.datetime64("2026-11-20T00:00:00", "us")
    return pa.table({
        "customer_id": order // 4,
        "week": (order % 4).astype(np.int32),
        "events": rng.integers(0, 1000, rows),
        "plan": pa.array(rng.choice(["free", "pro", "team"], rows)),
        "device": devices,
        "active_days": rng.integers(0, 128, rows),
        "event_time": pa.array(start + rng.integers(0, 6 * 86400 * 10**6, rows).astype("timedelta64[us]")),
    })


def source(name: str, directory: Path, schema: pa.Schema) -> TableSource:
    return TableSource(name, (directory,), "parquet", schema, (), directory)


def one_round(backend, input_dir: Path, schema: pa.Schema, scratch: Path, plan: CheckPlan) -> tuple[float, float]:
    """(the stage alone, the stage with its checks): the second writes as a run does when the output has
    checks (the engine measures what it writes where it holds it, else the checks read the files back)."""
    out = scratch / f"out-{time.monotonic_ns()}"
    out.mkdir()
    clock = time.perf_counter()
    backend.write(backend.read(source("input", input_dir, schema)), out)
    stage = time.perf_counter() - clock
    shutil.rmtree(out)
    out.mkdir()
    clock = time.perf_counter()
    written, values = backend.write_measured(backend.read(source("input", input_dir, schema)), out, (),
                                             TARGET_FILE_SIZE, plan)
    if values is None:  # read back: what the files answer, the rest by the engine (as a run measures it)
        values = files_then_engine(backend, source("output", out, written), plan)
    outcomes = [judge("output", c, values, plan, Published(values["hf_rows"]), dt.datetime.now(dt.timezone.utc))
                for c in plan.checks]
    checked = time.perf_counter() - clock
    assert all(o.passed for o in outcomes), [o.line() for o in outcomes if not o.passed]
    shutil.rmtree(out)
    return stage, checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shuffle", action="store_true", help="rows in random order, not in key order")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    args = parser.parse_args()
    checks, problems = read_checks(CHECKS, "output")
    assert not problems, problems
    plan = CheckPlan(checks)
    scratch = Path(tempfile.mkdtemp(prefix="bench-checks-"))
    try:
        data = table(args.rows, args.shuffle)
        (scratch / "input").mkdir()
        pq.write_table(data, scratch / "input" / "part-0.parquet")
        print(f"{args.rows:,} rows{' (shuffled)' if args.shuffle else ''}, {len(checks)} checks, "
              f"{args.rounds} rounds (medians)")
        print(f"{'engine':<8} {'stage s':>9} {'checked s':>9} {'checks s':>9} {'ratio':>7}")
        for name in args.engines:
            backend = start_engines(scratch, [name])[name]
            try:
                one_round(backend, scratch / "input", data.schema, scratch, plan)  # warm-up
                timed = [one_round(backend, scratch / "input", data.schema, scratch, plan) for _ in range(args.rounds)]
            finally:
                backend.stop()
            stage, checked = statistics.median(t[0] for t in timed), statistics.median(t[1] for t in timed)
            print(f"{name:<8} {stage:>9.2f} {checked:>9.2f} {checked - stage:>9.2f} {(checked - stage) / stage:>7.2f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
