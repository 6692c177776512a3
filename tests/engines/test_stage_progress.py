"""Progress inside long stages: while a stage runs, its engine says what it is doing (Spark's job and
tasks, Dask's tasks, Tune's trials and best score), the live display shows it on the stage's line and
plain output (cron, CI) prints it at most once per interval for stages that run that long. The
counts are the engine's own: the totals below are the task and trial counts the stages make."""

from __future__ import annotations

import io
import re
import time

import pytest
from rich.console import Console

import hybridflow
from hybridflow.reporting.progress import PlainListener, ProgressTicker, _stage_line
from hybridflow.results import StageResult

TASKS = 8  # each sleeps NAP seconds; two at a time (local[2], one Dask worker with 2 threads)
NAP = 1.0
TRIALS = 4
RAY_NAP = 2.5  # Ray Data reports to its stats actor every 5 s: a Ray Data stage runs 10 s

STAGES = f'''
import tempfile
import time

import pandas as pd


def nap(i):
    time.sleep({NAP})
    return i


def spark_slow(ctx):
    spark = ctx.spark
    count = spark.sparkContext.parallelize(range({TASKS}), {TASKS}).map(nap).count()
    return spark.createDataFrame(pd.DataFrame({{"n": [count]}}))


def dask_slow(ctx):
    import dask.dataframe as dd

    client = ctx.dask
    done = client.gather(client.map(nap, range({TASKS})))
    return dd.from_pandas(pd.DataFrame({{"n": [len(done)]}}), npartitions=1)


def ray_slow(ctx):
    def nap_batch(batch):
        time.sleep({RAY_NAP})
        return batch

    return ctx.ray.data.range({TASKS}, override_num_blocks={TASKS}).map_batches(nap_batch, batch_size=None)


def tuned(ctx):
    from ray import tune

    def trainable(config):
        time.sleep({NAP})
        tune.report({{"score": float(config["x"])}})

    tuner = tune.Tuner(trainable, param_space={{"x": tune.grid_search(list(range(1, {TRIALS} + 1)))}},
                       tune_config=tune.TuneConfig(metric="score", mode="max"),
                       run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(), verbose=0))
    best = tuner.fit().get_best_result().metrics["score"]
    return ctx.ray.data.from_pandas(pd.DataFrame({{"best": [best]}}))
'''

PIPELINE = '''
name: progress
backends:
  spark: {master: "local[2]", conf: {spark.sql.shuffle.partitions: 2}}
  dask: {n_workers: 1, threads_per_worker: 2}
  ray: {num_cpus: 2}
stages:
'''


def run_plain(project, stages: str) -> str:
    """Run the pipeline with plain output, a progress line at most every second per stage."""
    project.stages(STAGES)
    path = project.pipeline(PIPELINE + stages)
    out = io.StringIO()
    listener = PlainListener(Console(file=out, width=200), progress_every=1.0)
    hybridflow.run(path, listener=listener).raise_for_status()
    print(out.getvalue())  # shown with -s, and by pytest when a test fails
    return out.getvalue()


def progress_of(output: str, stage: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in output.splitlines() if line.startswith(f"progress {stage} ")]


def counts(phrases: list[str], what: str) -> list[tuple[int, int]]:
    return [(int(m[1]), int(m[2])) for p in phrases if (m := re.search(rf"{what} (\d+)/(\d+)", p))]


@pytest.mark.timeout(600)
def test_spark_and_dask_stages_show_their_tasks_done_out_of_the_total(project):
    output = run_plain(project, '''
  spark_slow: {run: "mypkg.steps:spark_slow", backend: spark, outputs: [a]}
  dask_slow: {run: "mypkg.steps:dask_slow", backend: dask, outputs: [b]}
''')
    spark, dask = progress_of(output, "spark_slow"), progress_of(output, "dask_slow")
    for name, phrases in (("spark", spark), ("dask", dask)):
        # the naps' tasks (publishing the output may add a short job or computation of its own)
        naps = [(done, total) for done, total in counts(phrases, "tasks") if total == TASKS]
        assert naps, (name, output)
        done = [d for d, _ in naps]
        # a look may come between the last task's end and its job's (longer on a busy machine): d <= TASKS
        assert done == sorted(done) and all(0 <= d <= TASKS for d in done), (name, naps)
    # the naps are the stage's first Spark job
    assert all(p.startswith("job 1 · tasks ") for p in spark if p.endswith(f"/{TASKS}")), spark


@pytest.mark.timeout(600)
def test_ray_stages_show_tune_trials_with_the_best_score_and_data_blocks(project):
    output = run_plain(project, '''
  tuned: {run: "mypkg.steps:tuned", backend: ray, outputs: [best]}
  ray_slow: {run: "mypkg.steps:ray_slow", backend: ray, outputs: [c]}
''')
    phrases = progress_of(output, "tuned")
    found = counts(phrases, "trials")
    assert found and {total for _, total in found} == {TRIALS}, output
    assert all(0 <= done <= TRIALS for done, _ in found), found
    scores = [float(m[1]) for p in phrases if (m := re.search(r"best score (\S+)", p))]
    assert scores == sorted(scores) and all(1 <= s <= TRIALS for s in scores), phrases
    blocks = counts(progress_of(output, "ray_slow"), "blocks")
    assert blocks and all(total == TASKS and 0 <= done <= TASKS for done, total in blocks), output


def test_plain_lines_only_for_long_stages_at_most_once_per_interval_and_when_changed():
    said: list[tuple[str, str, float]] = []
    quick = StageResult("quick", "engine", status="running", started_at=time.monotonic(), progress="tasks 1/2")
    slow = StageResult("slow", "engine", status="running", started_at=time.monotonic(), progress="tasks 1/9")
    every = 0.6
    ticker = ProgressTicker([quick, slow], every, lambda stage, phrase: said.append((stage.name, phrase,
                                                                                      time.monotonic())))
    lines = lambda: [(name, phrase) for name, phrase, _ in said]  # noqa: E731
    try:
        quick.status, quick.progress = "done", None  # ended before its first interval (its first look): no line
        said_within(lambda: said, "the slow stage's first line")
        assert lines() == [("slow", "tasks 1/9")]
        time.sleep(0.8)  # an interval or more with the same phrase: nothing new to say
        assert lines() == [("slow", "tasks 1/9")]
        slow.progress = "tasks 5/9"
        said_within(lambda: len(said) > 1, "the changed phrase")
        assert lines() == [("slow", "tasks 1/9"), ("slow", "tasks 5/9")]
        assert said[1][2] - said[0][2] >= every  # at most once per interval
    finally:
        ticker.stop()


def said_within(condition, what: str, seconds: float = 30) -> None:
    """Until `condition()`: the ticker's thread says it in its own time, later on a busy machine."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.02)


def test_the_live_line_of_a_running_stage_shows_its_progress():
    stage = StageResult("train", "engine", status="running", started_at=time.monotonic(), reason="inputs changed",
                        progress="trials 2/4 · best score 0.91")
    assert "trials 2/4 · best score 0.91" in _stage_line(stage).plain
    stage.status, stage.progress, stage.duration = "done", None, 3.0
    assert "trials" not in _stage_line(stage).plain and "inputs changed" in _stage_line(stage).plain
