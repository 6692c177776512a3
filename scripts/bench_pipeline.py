"""hybridflow against the glue script a user would otherwise write, on the weekly retrain example.

On the same generated data (scripts/generate_retrain_data.py), in a scratch copy of configs/ and
stages/, each in a fresh Python process as a user runs it:

  (1) hybridflow run configs/weekly_retrain.yaml, from nothing (no published data, no run record);
  (2) the glue script: the same stage functions (stages/retrain/*.py) called in order, each engine
      started when its first stage comes (Spark, then Dask, then Ray; Dask kept for training),
      Parquet written and read directly by each engine;
  (3) hybridflow's no-op rerun: every stage skipped, no engine started;
  (4) hybridflow run --watch: a save of one stage (the features function, made to add a column)
      re-runs it and the stages downstream (tune on Ray, train on Dask, evaluate) on the engines the
      session keeps running (a first save started them); timed from the save to the summary.

(1) and (2) run in turns, --rounds times (a run on 2 cores varies by a few seconds from one to the
next), each run from nothing; their medians and the median of the rounds' ratios are printed with
every round's figures.

Also the Spark ETL alone: hybridflow's etl stage (read + call + publish, from its run record) against
the glue script's ETL (read, the same function, each output written with Spark's own writer), per
round and their median; and the last run's stages with the engine work (Spark jobs, Dask task graphs,
Ray Data executions) each one's read, call and publish ran.

Prints each wall time and the ratios, with the targets: (1)/(2) <= 0.8, the ETL <= 1.15, (3) < 1 s and no engine
start, (4) no engine start. Wrap it in `flock /tmp/hf-heavy.lock` on a shared machine.

    python scripts/bench_pipeline.py                    # 2,000 customers, 12 weeks (the generator's default)
    python scripts/bench_pipeline.py --rounds 1         # one run each of (1) and (2): quicker, noisier
    python scripts/bench_pipeline.py --customers 50000  # bigger
    python scripts/bench_pipeline.py --workdir s3://BUCKET/PREFIX   # the retrain on S3 against local

With --workdir s3://... (the store the AWS variables name), it times instead hybridflow's run of the
retrain from nothing with its workdir there against the same run with a local workdir, in turns,
--rounds times (a fresh prefix and a fresh local cache each time), and prints the median ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = "configs/weekly_retrain.yaml"
EDITED = "stages/retrain/features.py"
# the edit: the features function (only) adds a column, so its output changes and the stages after it
# run again (tune on Ray, train on Dask, evaluate)
EDIT_AT = ".map_partitions(_customer_features, meta=meta, **options)"
ETL_SECONDS = "etl.seconds"  # where the glue script leaves the seconds of its Spark ETL
GLUE_WORK = "engine_work.json"  # where it leaves the Spark jobs and Dask task graphs each stage ran


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--customers", type=int, default=2000)
    parser.add_argument("--weeks", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3, help="runs of (1) and of (2), in turns")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--glue", type=Path, help=argparse.SUPPRESS)  # internal: run the glue script there
    parser.add_argument("--workdir", help="s3://BUCKET/PREFIX: time the retrain there against a local workdir")
    args = parser.parse_args()
    if args.glue:
        glue(args.glue)
        return
    scratch = Path(tempfile.mkdtemp(prefix="hybridflow-bench-pipeline-"))
    try:
        if args.workdir:
            on_store_against_local(scratch, args.customers, args.weeks, max(1, args.rounds), args.workdir)
        else:
            bench(scratch, args.customers, args.weeks, max(1, args.rounds))
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


def bench(scratch: Path, customers: int, weeks: int, rounds: int) -> None:
    prepare(scratch, customers, weeks)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    print(f"weekly retrain, {customers:,} customers, {weeks} weeks, in {scratch}", flush=True)

    glue_runs, full_runs, etl_ratios = [], [], []
    for round_ in range(rounds):
        for leftover in (scratch / "glue", scratch / ".hybridflow"):  # each run from nothing
            shutil.rmtree(leftover, ignore_errors=True)
        glue_runs.append(timed([sys.executable, str(Path(__file__).resolve()), "--glue", str(scratch)], scratch, env))
        full_runs.append(timed([sys.executable, "-m", "hybridflow.cli", "run", CONFIG], scratch, env))
        etl, glue_etl = etl_seconds(scratch), float((scratch / "glue" / ETL_SECONDS).read_text())
        etl_ratios.append(etl / glue_etl)
        print(f"round {round_ + 1}: (1) {full_runs[-1]:.2f} s, (2) {glue_runs[-1]:.2f} s, "
              f"(1)/(2) = {full_runs[-1] / glue_runs[-1]:.2f}; Spark ETL: (1) read + call + publish {etl:.2f} s, "
              f"(2) compute and write {glue_etl:.2f} s, {etl_ratios[-1]:.2f}", flush=True)
    glue_seconds, full_seconds = statistics.median(glue_runs), statistics.median(full_runs)
    ratio = statistics.median(full / glue for full, glue in zip(full_runs, glue_runs))
    etl_ratio = statistics.median(etl_ratios)
    print_stages(scratch)
    print_work_against_glue(scratch)
    noop_seconds = timed([sys.executable, "-m", "hybridflow.cli", "run", CONFIG], scratch, env)
    noop_starts = engine_starts(scratch)
    watch_seconds, watch_starts, watch_stages = watched_edit(scratch, env)
    edit(scratch / EDITED, 3)  # the same kind of edit, for comparison, run without --watch
    cold_seconds = timed([sys.executable, "-m", "hybridflow.cli", "run", CONFIG], scratch, env)
    cold_starts = engine_starts(scratch)

    rows = [
        ("(1) hybridflow run, from nothing", full_seconds,
         f"(1)/(2) = {ratio:.2f}" + (f" (median of {rounds} rounds)" if rounds > 1 else ""), "<= 0.8"),
        ("    its Spark ETL: read + call + publish", None, f"x (2)'s compute and write = {etl_ratio:.2f}", "<= 1.15"),
        ("(2) glue script", glue_seconds, "", ""),
        ("(3) no-op rerun", noop_seconds, f"engines started: {', '.join(noop_starts) or 'none'}",
         "< 1 s, none"),
        (f"(4) --watch rerun after a save of {EDITED}", watch_seconds,
         f"ran {', '.join(watch_stages)}; engines started: {', '.join(watch_starts) or 'none'}", "none"),
        ("    the same edit, hybridflow run without --watch", cold_seconds,
         f"(4)/this = {watch_seconds / cold_seconds:.2f}; engines started: {', '.join(cold_starts) or 'none'}", ""),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\n{'measure':<{width}}  {'seconds':>8}  {'result':<60}  target")
    for name, seconds, result, target in rows:
        print(f"{name:<{width}}  {'' if seconds is None else f'{seconds:8.2f}':>8}  {result:<60}  {target}")


def on_store_against_local(scratch: Path, customers: int, weeks: int, rounds: int, workdir: str) -> None:
    prepare(scratch, customers, weeks)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    print(f"weekly retrain, {customers:,} customers, {weeks} weeks: workdir {workdir} against local", flush=True)
    local_runs, store_runs = [], []
    for round_ in range(rounds):
        shutil.rmtree(scratch / ".hybridflow", ignore_errors=True)
        local_runs.append(timed([sys.executable, "-m", "hybridflow.cli", "run", CONFIG], scratch, env))
        on_store = {**env, "HYBRIDFLOW_CACHE": str(scratch / f"cache-{round_}")}
        store_runs.append(timed([sys.executable, "-m", "hybridflow.cli", "run", CONFIG, "--workdir",
                                 f"{workdir.rstrip('/')}/round-{round_}-{time.time_ns()}"], scratch, on_store))
        print(f"round {round_ + 1}: object storage {store_runs[-1]:.2f} s, local {local_runs[-1]:.2f} s, "
              f"ratio {store_runs[-1] / local_runs[-1]:.2f}", flush=True)
    ratio = statistics.median(there / here for there, here in zip(store_runs, local_runs))
    print(f"median: object storage {statistics.median(store_runs):.2f} s, local {statistics.median(local_runs):.2f} s,"
          f" ratio {ratio:.2f}")


def prepare(scratch: Path, customers: int, weeks: int) -> None:
    """A scratch copy of configs/ and stages/ with generated retrain data."""
    for part in ("configs", "stages"):
        shutil.copytree(REPO / part, scratch / part, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, str(REPO / "scripts" / "generate_retrain_data.py"), "--customers",
                    str(customers), "--weeks", str(weeks), "--out", str(scratch / "data" / "retrain")],
                   check=True, capture_output=True)


def timed(command: list[str], cwd: Path, env: dict) -> float:
    clock = time.monotonic()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - clock
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return seconds


def last_run(scratch: Path) -> tuple[dict, list[dict]]:
    sys.path.insert(0, str(REPO))
    from hybridflow.store.state import RunStore

    store = RunStore(scratch / ".hybridflow" / "runs.db")
    run = store.last_run("weekly-retrain")
    return run, store.spans(run["run_id"])


def etl_seconds(scratch: Path) -> float:
    """The last hybridflow run's etl stage: its read, call and publish (not its wait for Spark)."""
    from hybridflow.reporting.progress import step_seconds

    went = step_seconds(last_run(scratch)[1])["etl"]
    return went["read"] + went["call"] + went["publish"]


def print_stages(scratch: Path) -> None:
    """The last hybridflow run's stages: where each one's time went, and the engine work (Spark jobs,
    Dask task graphs, Ray Data executions) each phase ran."""
    from hybridflow.reporting.progress import engine_work_text, step_seconds
    from hybridflow.store.state import RunStore

    run, spans = last_run(scratch)
    steps = step_seconds(spans)
    print(f"\nthe last run (1), by stage{'':<8}read s  call s  publish s  engine work (read · call · publish)")
    for stage in RunStore(scratch / ".hybridflow" / "runs.db").stages(run["run_id"]):
        went = steps.get(stage["stage"], {})
        seconds = "  ".join(f"{went.get(step, 0.0):{width}.2f}" for step, width in
                            (("read", 6), ("call", 6), ("publish", 9)))
        print(f"  {stage['stage']:<10} {stage['backend']:<10}{'':<13}{seconds}  {engine_work_text(stage) or '-'}")


def print_work_against_glue(scratch: Path) -> None:
    """Spark jobs and Dask task graphs per stage: the last hybridflow run's (read, call and publish
    together) beside the glue script's, which runs only what each stage's own result and its write
    with the engine's own writer need (Ray's executions are not counted there)."""
    from hybridflow.store.state import RunStore

    run, _ = last_run(scratch)
    glue_work = json.loads((scratch / "glue" / GLUE_WORK).read_text())
    print(f"\nengine work per stage{'':<4}hybridflow  glue script  (Spark jobs, Dask task graphs)")
    for stage in RunStore(scratch / ".hybridflow" / "runs.db").stages(run["run_id"]):
        if stage["stage"] in glue_work:
            ours = sum(json.loads(stage.get("engine_work") or "{}").values())
            print(f"  {stage['stage']:<10} {stage['backend']:<10} {ours:>10}  {glue_work[stage['stage']]:>11}")


def engine_starts(scratch: Path) -> list[str]:
    from hybridflow.reporting.timeline import ENGINE_START

    return [span["detail"] for span in last_run(scratch)[1] if span["kind"] == ENGINE_START]


def watched_edit(scratch: Path, env: dict) -> tuple[float, list[str], list[str]]:
    """Seconds from a save of the features function to the end of the run it causes, on a watch
    session whose engines a first save already started; that run's engine starts and stages run."""
    from hybridflow.store.state import RunStore

    output = scratch / "watch.out"
    with output.open("w") as sink:
        # with Ctrl-C's default action, even when this benchmark runs in the background of a shell
        # (which starts it with SIGINT ignored, and a child would inherit that)
        process = subprocess.Popen([sys.executable, "-m", "hybridflow.cli", "run", "--watch", CONFIG],
                                   cwd=scratch, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(output, process, 1)
        edit(scratch / EDITED, 1)  # the first save starts the engines the rerun needs
        wait_for(output, process, 2)
        clock = time.monotonic()
        edit(scratch / EDITED, 2)
        wait_for(output, process, 3)
        seconds = time.monotonic() - clock
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=180)
    if code != 130:
        sys.exit(f"--watch ended with {code}, not 130:\n{output.read_text()[-3000:]}")
    store = RunStore(scratch / ".hybridflow" / "runs.db")
    run = store.last_run("weekly-retrain")
    ran = [s["stage"] for s in store.stages(run["run_id"]) if s["status"] == "done"]
    return seconds, engine_starts(scratch), ran


def edit(path: Path, number: int) -> None:
    text = path.read_text()
    if number > 1:
        text = text.replace(f"{EDIT_AT}.assign(edit={number - 1})", EDIT_AT)
    assert EDIT_AT in text, f"{path} changed: the benchmark's edit no longer applies"
    path.write_text(text.replace(EDIT_AT, f"{EDIT_AT}.assign(edit={number})", 1))


def wait_for(output: Path, process: subprocess.Popen, runs: int, seconds: float = 900) -> None:
    """Until the session has finished `runs` runs (it says it is watching after each)."""
    deadline = time.monotonic() + seconds
    while output.read_text().count("watching") < runs:
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"--watch did not finish run {runs}:\n{output.read_text()[-3000:]}")
        time.sleep(0.1)


# -- the glue script a user would write ---------------------------------------------------------------

class GlueContext:
    """What the stage functions ask of ctx, as a user would stub it."""

    def __init__(self, out: Path, **engines) -> None:
        import logging

        self.out, self.run_id, self.log = out, "glue", logging.getLogger("glue")
        self.gpus_per_trial = 0
        self.__dict__.update(engines)

    def output_path(self, name: str) -> Path:
        path = self.out / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def previous_output(self, name: str) -> Path | None:
        return None


def graph_counter():
    """A Dask scheduler plugin counting the task graphs it is given, as hybridflow's Dask engine does."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Counter(SchedulerPlugin):
        name = "bench-graphs"
        graphs = 0

        def update_graph(self, scheduler, **kwargs) -> None:
            self.graphs += 1
    return Counter()


def glue(scratch: Path) -> None:
    import yaml

    sys.path.insert(0, str(scratch))
    from stages.retrain.etl import weekly_etl
    from stages.retrain.evaluate import evaluate
    from stages.retrain.features import features
    from stages.retrain.train import train
    from stages.retrain.tune import tune_xgboost

    params = yaml.safe_load((scratch / CONFIG).read_text())["params"]
    data, out = scratch / "data" / "retrain", scratch / "glue"

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", 4)
             .config("spark.driver.memory", "2g").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    clock = time.monotonic()  # the ETL's read, call and write, as hybridflow's etl stage times them
    etl = weekly_etl(raw_events=spark.read.parquet(str(data / "events")),
                     customers=spark.read.parquet(str(data / "customers.parquet")), ctx=GlueContext(out, spark=spark))
    etl["customer_weeks"].write.partitionBy("delivery_week").parquet(str(out / "customer_weeks"))
    etl["etl_quality"].write.partitionBy("delivery_week").parquet(str(out / "etl_quality"))
    (out / ETL_SECONDS).write_text(str(time.monotonic() - clock))
    work = {"etl": max(spark.sparkContext.statusTracker().getJobIdsForGroup(None), default=-1) + 1}
    spark.stop()

    import dask.dataframe as dd
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None, host="127.0.0.1")
    client = Client(cluster)
    graphs = graph_counter()
    cluster.scheduler.add_plugin(graphs)  # the scheduler runs in this process
    client.upload_file(str(shutil.make_archive(str(out / "code"), "zip", scratch, "stages")))
    customer_weeks = dd.read_parquet(str(out / "customer_weeks"))
    features(customer_weeks=customer_weeks, horizon=params["horizon"], test_weeks=params["test_weeks"],
             valid_weeks=params["valid_weeks"]).to_parquet(str(out / "customer_features"))
    work["features"] = graphs.graphs

    import ray

    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"py_modules": [str(scratch / "stages")]})
    tuned = tune_xgboost(customer_features=ray.data.read_parquet(str(out / "customer_features")),
                         num_samples=params["num_samples"], search=params["search"], seed=params["seed"],
                         ctx=GlueContext(out, ray=ray))
    for name, dataset in tuned.items():
        dataset.write_parquet(str(out / name))
    ray.shutdown()

    train(customer_features=dd.read_parquet(str(out / "customer_features")),
          best_params=dd.read_parquet(str(out / "best_params")), seed=params["seed"], ctx=GlueContext(out, dask=client))
    work["train"] = graphs.graphs - work["features"]
    (out / GLUE_WORK).write_text(json.dumps(work))
    client.close()
    cluster.close()

    import pandas as pd

    evaluate(customer_features=pd.read_parquet(out / "customer_features"), model=out / "model", ctx=GlueContext(out))


if __name__ == "__main__":
    main()
