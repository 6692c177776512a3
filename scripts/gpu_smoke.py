"""GPU smoke test and benchmark, for a machine with an NVIDIA GPU (pip install -e '.[all,gpu]').

1. Runs the weekly retrain (configs/weekly_retrain.yaml) with `gpu: auto` on its etl, features and
   tune stages, through the CLI, so the summary table shows which device each stage used.
2. Benchmarks the etl (Spark, RAPIDS Accelerator) and features (Dask, dask-cudf) stages on the CPU
   and on the GPU of this machine, on the same generated data: seconds (engine start-up excluded,
   best of --repeat), input rows per second, and the GPU/CPU speed ratio.

    python scripts/gpu_smoke.py                                  # 200,000 customers, 26 weeks
    python scripts/gpu_smoke.py --customers 20000 --weeks 12 --repeat 1

The Spark stages need the RAPIDS Accelerator jar (see README, "GPU (RAPIDS)"); without it the
etl stage stays on the CPU and its GPU column says why. Exits with 69 when no GPU is usable.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hybridflow.backends import gpu  # noqa: E402
from hybridflow.definition.config import load_pipeline  # noqa: E402
from hybridflow.errors import ExitCode  # noqa: E402
from hybridflow.execution.runner import Runner  # noqa: E402
from hybridflow.results import RunOptions, Selection  # noqa: E402

CONFIG = REPO / "configs" / "weekly_retrain.yaml"
DATA = "data/retrain"  # where the example pipeline's datasets live, relative to its root
SMOKE_STAGES = ("etl", "features", "tune")
BENCH_STAGES = ("etl", "features")


def ensure_data(out: Path, customers: int, weeks: int) -> None:
    if (out / "customers.parquet").exists():
        return
    subprocess.run([sys.executable, str(REPO / "scripts" / "generate_retrain_data.py"), "--out", str(out),
                    "--customers", str(customers), "--weeks", str(weeks)], check=True)


def variant(data: Path, workdir: Path, modes: dict[str, bool | str], into: Path, bench: bool = False) -> Path:
    """The example pipeline with its data under `data`, its own workdir and each stage's gpu mode."""
    spec = yaml.safe_load(CONFIG.read_text())
    spec["root"], spec["workdir"] = str(REPO), str(workdir)
    for dataset in spec.get("datasets", {}).values():
        if isinstance(dataset, dict) and str(dataset.get("path", "")).startswith(DATA):
            dataset["path"] = str(data / dataset["path"][len(DATA) + 1:])
    for stage, mode in modes.items():
        spec["stages"][stage]["gpu"] = mode
    if bench:  # the whole machine, the same for CPU and GPU runs
        cores = os.cpu_count() or 2
        spark = spec.setdefault("backends", {}).setdefault("spark", {})
        spark["master"] = "local[*]"
        spark.setdefault("conf", {}).update({"spark.driver.memory": "16g", "spark.sql.shuffle.partitions": cores * 2})
        spec["backends"]["dask"] = {"n_workers": max(1, cores // 2), "threads_per_worker": 2}
    into.write_text(yaml.safe_dump(spec, sort_keys=False))
    return into


def raw_rows(data: Path) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in (data / "events").rglob("*.parquet"))


def timed(file: Path, stage: str) -> tuple[float, int | None, bool | None, str | None]:
    """One forced run of one stage: (seconds without engine start-up, rows in, ran on GPU, why)."""
    result = Runner(load_pipeline(file), RunOptions(Selection(only=[stage]), force=True)).run()
    ran = result.stages[stage]
    if result.status != "success":
        raise SystemExit(f"{stage} failed: {ran.error} (log: {ran.log_path})")
    return ran.duration - (ran.engine_start or 0.0), ran.rows_in, ran.gpu, ran.gpu_reason


def benchmark(data: Path, workdir: Path, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        modes = {"cpu": False, "gpu": "auto"}
        files = {device: variant(data, workdir, {s: mode for s in BENCH_STAGES}, Path(tmp) / f"{device}.yaml",
                                 bench=True) for device, mode in modes.items()}
        # the inputs for features
        Runner(load_pipeline(files["cpu"]), RunOptions(Selection(only=["etl"]), force=True)).run()
        print(f"{'stage':<9} {'engine':<6} {'rows in':>12} {'CPU s':>8} {'CPU rows/s':>12} {'GPU s':>8} "
              f"{'GPU rows/s':>12} {'GPU/CPU':>8}")
        for stage in BENCH_STAGES:
            best = {}
            for device, file in files.items():
                runs = [timed(file, stage) for _ in range(repeat)]
                best[device] = min(runs, key=lambda r: r[0])
            rows = raw_rows(data) if stage == "etl" else best["cpu"][1] or 0
            (cpu_s, *_), (gpu_s, _, on_gpu, why) = best["cpu"], best["gpu"]
            engine = load_pipeline(files["cpu"]).stages[stage].backend
            gpu_cells = f"{gpu_s:>8.2f} {rows / gpu_s:>12,.0f} {cpu_s / gpu_s:>7.2f}x" if on_gpu else \
                f"{'-':>8} {'-':>12} {'-':>8}  (stayed on the CPU: {why})"
            print(f"{stage:<9} {engine:<6} {rows:>12,} {cpu_s:>8.2f} {rows / cpu_s:>12,.0f} {gpu_cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--customers", type=int, default=200_000, help="benchmark data size")
    parser.add_argument("--weeks", type=int, default=26)
    parser.add_argument("--repeat", type=int, default=2, help="runs per stage and device; the best counts")
    args = parser.parse_args()

    found = gpu.probe()
    if not found.devices:
        print(f"gpu_smoke: no usable GPU here: {found.problem}", file=sys.stderr)
        raise SystemExit(int(ExitCode.UNAVAILABLE))
    for name, value in gpu.report(found):
        print(f"{name:<17} {value}")

    workdir = Path(tempfile.mkdtemp(prefix="hybridflow-gpu-smoke-"))
    example = REPO / DATA
    ensure_data(example, 2000, 12)
    with tempfile.TemporaryDirectory() as tmp:
        file = variant(example, workdir / "example", {s: "auto" for s in SMOKE_STAGES}, Path(tmp) / "auto.yaml")
        print(f"\n== the weekly retrain with gpu: auto on {', '.join(SMOKE_STAGES)} ==", flush=True)
        done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", str(file)], cwd=REPO)
        if done.returncode != 0:
            raise SystemExit(done.returncode)

    data = example / f"gpu-bench-{args.customers}x{args.weeks}"  # under data/retrain/, which git ignores
    ensure_data(data, args.customers, args.weeks)
    print(f"\n== CPU vs GPU on {raw_rows(data):,} raw events ({args.customers:,} customers, {args.weeks} weeks), "
          f"best of {args.repeat} ==", flush=True)
    benchmark(data, workdir / "bench", args.repeat)
    print(f"\nrun records and logs: {workdir}")


if __name__ == "__main__":
    main()
