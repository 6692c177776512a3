"""Benchmark: the scale curve of the weekly retrain's ETL (Spark) and features (Dask) stages.

    python scripts/bench_scale.py                    # ~5M, 20M and 50M events (scaled customers, 12 weeks)
    python scripts/bench_scale.py --sizes 5,20       # sizes in millions of events
    python scripts/bench_scale.py --full             # the whole retrain (tune, train, evaluate too)
    python scripts/bench_scale.py --tiny             # one size of 50,000 events: the same code path in <1 min
    python scripts/bench_scale.py --json report.json # also write the report as JSON

Run it alone on the machine (flock /tmp/hf-heavy.lock ... where machines are shared): it is a
timing. For each size, in a scratch copy of the example (removed afterwards unless --keep), it
generates the raw events (scripts/generate_retrain_data.py), runs configs/weekly_retrain.yaml through
the CLI in a subprocess, with engines sized for 2 cores and 24 GiB (ENGINES below, written into a copy
of the YAML), and prints:
  - per-stage seconds from the run records, without the engine's start-up (printed apart);
  - seconds per million events (the stages' seconds without start-ups, divided by the events);
  - the peak RSS of hybridflow's own process and of its whole process tree (the JVM, Dask workers,
    Ray), sampled every 0.2 s with psutil, or from /proc where psutil is not installed; the tree's
    is the sum of its processes' RSS, so memory they share counts more than once (an upper bound);
  - files per output dataset, their median size, and the most files the target allows, from the
    manifests of the published versions;
  - every measure's ratio to the smallest size's, and whether each target holds:
      seconds per million events at the largest size <= 1.3 x at the smallest;
      hybridflow's own process < 1 GiB at every size; the whole tree < 16 GiB at the largest size;
      no dataset version with more files than max(its partitions, ceil(bytes / 64 MiB)).
It exits 1 if a run fails; a missed target is reported, not an error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import yaml

REPO = Path(__file__).resolve().parent.parent
PIPELINE = "configs/weekly_retrain.yaml"
BENCH_PIPELINE = "configs/bench_scale.yaml"
EVENTS_PER_CUSTOMER = 82  # over the generator's 12 weeks (measured: 4.92M events from 60,000 customers)
DEFAULT_SIZES = (5.0, 20.0, 50.0)
TINY_SIZES = (0.05,)
# 2 cores and 24 GiB: Spark's local driver (a JVM keeps the heap it grew to), two one-thread Dask workers,
# Ray's object store. The ETL and features hold Spark's and Dask's at once: 6 GiB of heap (+ ~1 GiB of
# JVM) and 2 x 4 GiB, inside the 16 GiB tree target with hybridflow's own process, leaving the rest of
# the 24 GiB to the OS and the page cache. (With a 10 GiB heap and 2 x 5 GiB the tree reached 21 GiB.)
ENGINES = {
    "spark": {"master": "local[2]", "conf": {"spark.driver.memory": "6g", "spark.sql.shuffle.partitions": 4}},
    "dask": {"n_workers": 2, "threads_per_worker": 1, "memory_limit": "4GiB"},
    "ray": {"num_cpus": 2, "init": {"object_store_memory": 2 * 2**30}},
}
GIB, MIB = 2**30, 2**20
OWN_LIMIT, TREE_LIMIT, SPEED_RATIO = 1 * GIB, 16 * GIB, 1.3
BYTES_PER_FILE = 64 * MIB  # a dataset version may have one file per this many bytes (or per partition)
SAMPLE_EVERY = 0.2


# ---- memory of a process tree -------------------------------------------------------------------------

def tree_rss(pid: int) -> tuple[int, int]:
    """(RSS of `pid`, summed RSS of `pid` and all its descendants), in bytes; (0, 0) once it is gone."""
    try:
        import psutil
    except ImportError:
        return proc_tree_rss(pid)
    try:
        root = psutil.Process(pid)
        own = root.memory_info().rss
        children = root.children(recursive=True)
    except psutil.Error:
        return 0, 0
    total = own
    for child in children:
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass  # ended between listing and reading
    return own, total


def proc_tree_rss(pid: int) -> tuple[int, int]:
    """tree_rss from /proc directly (Linux), for machines without psutil."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])  # after "(comm)": state, ppid
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent and child not in tree]
        tree.update(children)
        frontier.extend(children)
    sizes = {p: _proc_rss(p) for p in tree}
    return sizes[pid], sum(sizes.values())


def _proc_rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


# ---- one size ------------------------------------------------------------------------------------------

def prepare(project: Path, customers: int) -> tuple[int, float]:
    """A scratch copy of the example with the bench's engine settings and generated data: (events, seconds)."""
    for part in ("configs", "stages", "scripts"):
        shutil.copytree(REPO / part, project / part, ignore=shutil.ignore_patterns("__pycache__"))
    spec = yaml.safe_load((project / PIPELINE).read_text())
    spec["backends"] = ENGINES
    (project / BENCH_PIPELINE).write_text(yaml.safe_dump(spec, sort_keys=False))
    clock = time.perf_counter()
    subprocess.run([sys.executable, "scripts/generate_retrain_data.py", "--customers", str(customers)],
                   cwd=project, check=True, capture_output=True)
    seconds = time.perf_counter() - clock
    events = sum(pq.ParquetFile(f).metadata.num_rows for f in (project / "data/retrain/events").rglob("*.parquet"))
    return events, seconds


def run_pipeline(project: Path, stages: list[str] | None) -> dict:
    """Run the bench pipeline through the CLI (all stages, or only `stages`), sampling the memory of its
    process tree every SAMPLE_EVERY seconds: wall seconds, peak RSS of its own process and of the tree."""
    selection = [arg for stage in stages for arg in ("--only", stage)] if stages else []
    command = [sys.executable, "-m", "hybridflow.cli", "run", BENCH_PIPELINE, *selection]
    log = project / "bench-run.log"
    peaks = {"own_peak_bytes": 0, "tree_peak_bytes": 0, "rss_samples": 0}
    clock = time.perf_counter()
    with log.open("w") as output:
        child = subprocess.Popen(command, cwd=project, stdout=output, stderr=subprocess.STDOUT)
        while child.poll() is None:
            own, tree = tree_rss(child.pid)
            peaks = {"own_peak_bytes": max(peaks["own_peak_bytes"], own),
                     "tree_peak_bytes": max(peaks["tree_peak_bytes"], tree), "rss_samples": peaks["rss_samples"] + 1}
            time.sleep(SAMPLE_EVERY)
    wall = time.perf_counter() - clock
    if child.returncode != 0:
        sys.exit(f"the run failed ({child.returncode}) in {project}:\n{log.read_text()}")
    return {"wall_s": wall, **peaks}


def stage_records(project: Path) -> dict[str, dict]:
    import hybridflow

    [last] = hybridflow.runs(project / BENCH_PIPELINE, limit=1, stages=True)
    return {s["stage"]: s for s in last["stages"] if s["status"] == "done"}


def dataset_files(project: Path, stages: list[str]) -> dict[str, dict]:
    """Per table dataset the stages published: files, partitions, bytes, median file size and the most
    files allowed (from the published versions' manifests)."""
    import hybridflow
    from hybridflow.store.catalog import Catalog

    pipeline = hybridflow.load(project / BENCH_PIPELINE)
    catalog = Catalog(pipeline.workdir / pipeline.name)
    found = {}
    for name in (dataset for stage in stages for dataset in pipeline.stages[stage].outputs):
        version = catalog.current(name)
        if version is None or version.manifest.get("kind") != "table":
            continue
        files = version.manifest["files"]
        sizes = [f["size"] for f in files]
        partitions = len({str(Path(f["path"]).parent) for f in files})
        found[name] = {"files": len(files), "partitions": partitions, "bytes": sum(sizes),
                       "median_file_bytes": statistics.median(sizes) if sizes else 0,
                       "allowed_files": max(partitions, math.ceil(sum(sizes) / BYTES_PER_FILE))}
    return found


def measure(size: float, stages: list[str] | None, root: Path, keep: bool) -> dict:
    customers = max(1, round(size * 1e6 / EVENTS_PER_CUSTOMER))
    project = Path(tempfile.mkdtemp(prefix=f"hybridflow-scale-{size:g}M-", dir=root))
    print(f"== {size:g}M events ({customers:,} customers) in {project}", file=sys.stderr, flush=True)
    try:
        events, generate_s = prepare(project, customers)
        run = run_pipeline(project, stages)
        records = stage_records(project)
        datasets = dataset_files(project, list(records))
    finally:
        if not keep:
            shutil.rmtree(project, ignore_errors=True)
    per_stage = {name: {"seconds": r["duration"] - (r["engine_start"] or 0.0),
                        "engine_start": r["engine_start"] or 0.0} for name, r in records.items()}
    work = sum(s["seconds"] for s in per_stage.values())
    return {"size_m": size, "events": events, "customers": customers, "generate_s": generate_s,
            "stages": per_stage, "work_s": work, "s_per_m_events": work / (events / 1e6), **run,
            "datasets": datasets}


# ---- the report ----------------------------------------------------------------------------------------

NUMBER = re.compile(r"[-\d.,]+[xM]?")
RATIO_MEASURES = ("events", "work_s", "s_per_m_events", "own_peak_bytes", "tree_peak_bytes")


def ratios(results: list[dict]) -> list[dict]:
    """Each size's measures divided by the smallest size's."""
    base = results[0]
    return [{"size_m": r["size_m"], **{m: r[m] / base[m] if base[m] else None for m in RATIO_MEASURES}}
            for r in results]


def targets(results: list[dict]) -> list[dict]:
    smallest, largest = results[0], results[-1]
    speed = largest["s_per_m_events"] / smallest["s_per_m_events"] if smallest["s_per_m_events"] else math.inf
    own = max(r["own_peak_bytes"] for r in results)
    crowded = sorted(((d["files"] / d["allowed_files"], f"{name} at {r['size_m']:g}M: {d['files']} > "
                       f"{d['allowed_files']}") for r in results for name, d in r["datasets"].items()
                      if d["files"] > d["allowed_files"]), reverse=True)  # the worst first
    return [
        {"target": f"s/M events at {largest['size_m']:g}M <= {SPEED_RATIO}x at {smallest['size_m']:g}M",
         "value": f"{speed:.2f}x", "ok": speed <= SPEED_RATIO},
        {"target": "hybridflow's own process < 1 GiB at every size", "value": f"{own / MIB:,.0f} MiB",
         "ok": own < OWN_LIMIT},
        {"target": f"whole tree < 16 GiB at {largest['size_m']:g}M",
         "value": f"{largest['tree_peak_bytes'] / MIB:,.0f} MiB", "ok": largest["tree_peak_bytes"] < TREE_LIMIT},
        {"target": "files per version <= max(partitions, bytes / 64 MiB)",
         "value": f"{len(crowded)} over, worst {crowded[0][1]}" if crowded else "all within", "ok": not crowded},
    ]


def print_report(results: list[dict], checks: list[dict]) -> None:
    stages = sorted({s for r in results for s in r["stages"]}, key=lambda s: min(
        list(r["stages"]).index(s) for r in results if s in r["stages"]))
    print(f"engines: {json.dumps(ENGINES)}")
    header = ["size", "events", "customers", "gen s", *[f"{s} s" for s in stages], "engine wait s",
              "stages s", "s/M events", "wall s", "own RSS MiB", "tree RSS MiB"]
    rows = [[f"{r['size_m']:g}M", f"{r['events']:,}", f"{r['customers']:,}", f"{r['generate_s']:.1f}",
             *[f"{r['stages'][s]['seconds']:.1f}" if s in r["stages"] else "-" for s in stages],
             f"{sum(s['engine_start'] for s in r['stages'].values()):.1f}", f"{r['work_s']:.1f}",
             f"{r['s_per_m_events']:.2f}", f"{r['wall_s']:.1f}", f"{r['own_peak_bytes'] / MIB:,.0f}",
             f"{r['tree_peak_bytes'] / MIB:,.0f}"] for r in results]
    _table(header, rows)
    print()
    _table(["size", "dataset", "partitions", "files", "allowed", "median file MiB", "MiB"],
           [[f"{r['size_m']:g}M", name, str(d["partitions"]), str(d["files"]), str(d["allowed_files"]),
             f"{d['median_file_bytes'] / MIB:.2f}", f"{d['bytes'] / MIB:.1f}"]
            for r in results for name, d in r["datasets"].items()])
    print()
    _table(["size", "x events", "x stages s", "x s/M events", "x own RSS", "x tree RSS"],
           [[f"{q['size_m']:g}M", *[f"{q[m]:.2f}" if q[m] is not None else "-" for m in RATIO_MEASURES]]
            for q in ratios(results)])
    print()
    _table(["target", "measured", "result"], [[c["target"], c["value"], "PASS" if c["ok"] else "FAIL"]
                                              for c in checks])


def _table(header: list[str], rows: list[list[str]]) -> None:
    """Numbers right-aligned, words left-aligned (a column of words: its header too)."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    words = [any(not NUMBER.fullmatch(cell) for cell in column[1:]) for column in zip(header, *rows)]
    for row in (header, *rows):
        print("  ".join(cell.ljust(width) if word else cell.rjust(width)
                        for cell, width, word in zip(row, widths, words)).rstrip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=",".join(f"{s:g}" for s in DEFAULT_SIZES),
                        help="millions of events, comma-separated (default 5,20,50)")
    parser.add_argument("--tiny", action="store_true", help=f"--sizes {TINY_SIZES[0]:g}: the code path, quickly")
    parser.add_argument("--stages", default="etl,features", help="the stages to run (default etl,features)")
    parser.add_argument("--full", action="store_true", help="run every stage of the retrain")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()), help="where scratch projects go")
    parser.add_argument("--keep", action="store_true", help="keep the scratch projects")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    sizes = sorted(TINY_SIZES if args.tiny else {float(s) for s in args.sizes.split(",") if s.strip()})
    stages = None if args.full else [s.strip() for s in args.stages.split(",") if s.strip()]
    results = [measure(size, stages, args.root, args.keep) for size in sizes]
    checks = targets(results)
    print_report(results, checks)
    if args.json:
        args.json.write_text(json.dumps({"engines": ENGINES, "sizes": results, "ratios": ratios(results),
                                         "targets": checks}, indent=2))


if __name__ == "__main__":
    main()
