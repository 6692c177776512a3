"""Ray's partitioned writes and sorts on an embedded instance: what keeping idle workers warm saves.

A partitioned output on Ray gathers each partition value's rows with a key-based shuffle, whose
actors (with Ray Data's own statistics and autoscaling actors) hold a little CPU; Ray then keeps
fewer idle workers than CPUs and kills warm ones, so the next shuffle or sort started cold worker
processes again. This times, on a fresh local instance started as a run starts it, --rounds rounds of:
a partitioned write of a small table (as a stage output), a sort, and a map over batches; once with
hybridflow's setting (RaySettings' instance, idle workers kept beyond one per CPU) and once with Ray's
default, each on its own instance, and prints the medians of each and their ratio.

    python scripts/bench_ray_shuffles.py
    python scripts/bench_ray_shuffles.py --rounds 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from hybridflow.store.catalog import Catalog
from hybridflow.testing import publish_through, start_engine
from tests.support.engines import TEST_SETTINGS

TABLE = pa.table({"customer": list(range(8)), "week": pa.array([19700 + i % 3 for i in range(8)], pa.int32())
                  .cast(pa.date32()), "spend": [float(i) for i in range(8)]})


def timed_rounds(rounds: int, keep_warm: bool, scratch: Path) -> dict[str, list[float]]:
    import ray

    from hybridflow.backends import ray as ray_backend

    settings = TEST_SETTINGS["ray"]
    if not keep_warm:  # Ray's own limit: one idle worker per CPU
        settings = settings.model_copy(update={"init": {"_system_config": {}}})
    engine = start_engine("ray", settings, scratch)
    times: dict[str, list[float]] = {"partitioned write": [], "sort": [], "map": []}
    try:
        for number in range(rounds + 1):  # the first round warms up, untimed
            base = scratch / f"round-{keep_warm}-{number}"
            base.mkdir()
            steps = {
                "partitioned write": lambda base=base: publish_through(engine, Catalog(base / "home"), base, "out",
                                                                       TABLE, ("week",)),
                "sort": lambda: ray.data.from_arrow(TABLE).sort("spend", descending=True).materialize(),
                "map": lambda: ray.data.from_arrow(TABLE).map_batches(ray_backend._same,
                                                                      batch_format="pyarrow").materialize(),
            }
            for name, step in steps.items():
                clock = time.perf_counter()
                step()
                if number:
                    times[name].append(time.perf_counter() - clock)
    finally:
        engine.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-ray-shuffles-"))
    try:
        warm = timed_rounds(args.rounds, True, scratch)
        default = timed_rounds(args.rounds, False, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{args.rounds} rounds after one warm-up (medians, seconds)")
    print(f"{'step':<18} {'warm idle':>10} {'ray default':>12} {'ratio':>7}")
    for name in warm:
        ours, theirs = statistics.median(warm[name]), statistics.median(default[name])
        print(f"{name:<18} {ours:>10.2f} {theirs:>12.2f} {ours / theirs:>7.2f}")


if __name__ == "__main__":
    main()
