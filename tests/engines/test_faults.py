"""Fault tests on real runs with real engines: killed, interrupted, timed out, flaky and concurrent.
Each checks the exit code, the run record, that the last good outputs are intact, and that no
process of the run is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hybridflow.store.catalog import Catalog
from hybridflow.store.state import RunStore
from tests.runs.test_kill import assert_complete
from tests.support.engines import assert_nothing_left, child_pids
from tests.support.projects import last_run_record

STAGES = '''
import os
import time

import pandas as pd


def make(rows):
    return pd.DataFrame({"gen": [0] * rows, "i": range(rows)})


def spark_slow(numbers, slow):
    from pyspark.sql import functions as F, types as T

    def wait(i):
        time.sleep(slow)
        return i

    # lazy: the sleeping happens while the runner writes the output
    return numbers.withColumn("j", F.udf(wait, T.LongType())("i"))


def dask_slow(numbers, slow):
    def wait(part):
        time.sleep(slow * len(part))
        return part

    return numbers.map_partitions(wait, meta=numbers._meta)


def ray_slow(numbers, slow, working):
    def wait(batch):
        if working:  # a file the test waits for: Ray's workers are at the stage's work
            open(working, "a").close()
        time.sleep(slow * len(batch))
        return batch

    return numbers.map_batches(wait, batch_format="pandas")


def python_slow(numbers, slow):
    time.sleep(slow)
    return numbers


def gated(numbers, gate):
    """Holds its run open until the test creates the file `gate`."""
    deadline = time.monotonic() + 600
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gate file {gate} did not appear within 600 s")
        time.sleep(0.1)
    return numbers


def flaky(numbers, counter):
    tries = int(open(counter).read()) if os.path.exists(counter) else 0
    open(counter, "w").write(str(tries + 1))
    if tries < 2:
        raise ConnectionError(f"the source hung up (try {tries + 1})")
    return numbers
'''


def pipeline(project, backend: str, function: str, work: str = "") -> Path:
    """The faults pipeline: `make` on python, then `work` on `backend`; `work` adds keys to that stage."""
    project.stages(STAGES)
    return project.pipeline(f'''
    name: faults
    params: {{rows: 200, slow: 0.0, working: ""}}
    backends:
      spark: {{master: "local[2]", conf: {{spark.sql.shuffle.partitions: 2}}}}
      dask: {{n_workers: 1, threads_per_worker: 2}}
      ray: {{num_cpus: 2}}
    stages:
      make: {{run: mypkg.steps:make, outputs: [numbers]}}
      work:
        backend: {backend}
        run: mypkg.steps:{function}
        inputs: [numbers]
        outputs: [result]
        {work}''')


def start(project, *args: str, marker: str | None = None) -> tuple[subprocess.Popen, str]:
    marker = marker or uuid.uuid4().hex
    env = {**os.environ, "HYBRIDFLOW_TEST_RUN": marker}
    process = subprocess.Popen([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml", *args],
                               cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, marker


def run(project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "pipeline.yaml", *args], cwd=project.root,
                          capture_output=True, text=True, timeout=240)


def wait_for(condition, what: str, process: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, f"the run ended before {what}: {process.stdout.read()}"
        assert time.monotonic() < deadline, f"timed out after {seconds} s waiting for {what}"
        time.sleep(0.1)


def blocked_on_a_lock(pid: int) -> bool:
    """The command `pid` is waiting for a lock another process holds (a blocked waiter in /proc/locks:
    "N: -> FLOCK ..."): the command itself, or the run's process it supervises."""
    waiters = {str(pid), *(str(child) for child in child_pids(pid))}
    with open("/proc/locks") as locks:
        return any(fields[1:3] == ["->", "FLOCK"] and fields[5] in waiters
                   for fields in (line.split() for line in locks) if len(fields) > 5)


def stage_log_says(project, text: str, runs_before: int = 0):
    """The stage log of the newest run (the (runs_before + 1)th) holds `text`."""
    def found() -> bool:
        logs = sorted(project.home("faults").glob("runs/*/logs/work.log"))
        return len(logs) > runs_before and text in logs[-1].read_text()
    return found


def test_sigkill_during_a_spark_write_keeps_the_last_good_output(project):
    pipeline(project, "spark", "spark_slow")
    assert run(project).returncode == 0
    catalog = Catalog(project.home("faults"))
    good = catalog.current("result").id
    process, marker = start(project, "--force", "work", "-p", "slow=0.5")
    staging = project.home("faults") / "staging"
    # the stage returned its lazy frame and the runner is writing it: Spark's temporary files appear
    wait_for(lambda: any(staging.glob("*/result/_spark_output/_temporary")), "the spark write", process)
    time.sleep(1)
    process.kill()
    process.wait(60)
    assert_nothing_left(marker, 60)  # the JVM and its Python workers die with their driver
    assert catalog.current("result").id == good
    assert assert_complete(catalog, "result", 200) == 0
    after = run(project)  # proceeds: the kernel lock died with the killed run
    assert after.returncode == 0, after.stdout + after.stderr
    assert not staging.exists() or not any(staging.iterdir())  # the dead run's staging is gone
    runs = RunStore(project.root / ".hybridflow" / "runs.db").runs("faults")
    assert [r["status"] for r in runs] == ["success", "killed", "success"]


def test_sigterm_during_a_ray_stage_stops_cleanly(project):
    pipeline(project, "ray", "ray_slow")
    assert run(project).returncode == 0
    catalog = Catalog(project.home("faults"))
    good = catalog.current("result").id
    # 10 s a row: a run that waited for its work instead of stopping it would not exit in time
    working = project.root / "working"
    process, marker = start(project, "--force", "work", "-p", "slow=10", "-p", f"working={working}")
    wait_for(working.exists, "Ray's workers to begin the stage's batches", process)
    process.send_signal(signal.SIGTERM)
    try:
        rc = process.wait(180)
    except subprocess.TimeoutExpired:
        pytest.fail("the run did not exit within 180 s of SIGTERM: it waited for its ray work instead of stopping it")
    assert rc == 143, process.stdout.read()
    record, stages = last_run_record(project.root / ".hybridflow")
    assert record["status"] == "interrupted" and stages["work"]["status"] == "failed"
    assert catalog.current("result").id == good
    assert_nothing_left(marker, 60)


@pytest.mark.parametrize("backend, function", [("spark", "spark_slow"), ("dask", "dask_slow"),
                                               ("ray", "ray_slow"), ("python", "python_slow")])
def test_a_stage_past_its_timeout_is_cancelled_and_fails(project, backend, function):
    # 4 s: past an engine's first tasks, so running work is what the timeout cancels (engine start-up
    # is not counted), and ample for the python stage that sleeps 1 s to finish in time
    pipeline(project, backend, function, work="timeout: 4s")
    # The engines' work takes 5 s a row (400 rows: far past the 300 s this test waits for it).
    process, marker = start(project, "-p", "slow=1" if backend == "python" else "slow=5", "-p", "rows=400")
    if backend == "python":  # 1 s: in time. Then the same stage asked to sleep an hour.
        try:
            rc = process.wait(180)
        except subprocess.TimeoutExpired:
            pytest.fail("the python run that sleeps 1 s did not finish within 180 s")
        assert rc == 0, process.stdout.read()
        process, marker = start(project, "-p", "slow=3600")
    try:
        output, _ = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("the run did not end within 300 s: its stage's 4s timeout did not stop the work")
    assert process.returncode == 124, output
    assert "work failed: stage 'work' timed out after 4s; its engine work was cancelled" in output
    record, stages = last_run_record(project.root / ".hybridflow")
    assert record["status"] == "failed" and stages["work"]["status"] == "failed"
    assert "timed out after 4s" in stages["work"]["error"]
    catalog = Catalog(project.home("faults"))
    if backend == "python":
        assert assert_complete(catalog, "result", 400) == 0  # the run that finished in time
    else:
        assert catalog.current("result") is None
    assert_nothing_left(marker, 60)


def test_a_stage_that_fails_twice_then_succeeds(project, tmp_path):
    counter = tmp_path / "tries"
    project.stages(STAGES)
    project.pipeline(f'''
    name: faults
    params: {{rows: 10, counter: "{counter}"}}
    stages:
      make: {{run: mypkg.steps:make, outputs: [numbers]}}
      work: {{run: mypkg.steps:flaky, inputs: [numbers], outputs: [result], retries: 2, retry_delay: 0.2s}}
    ''')
    done = run(project)
    assert done.returncode == 0, done.stdout + done.stderr
    _, stages = last_run_record(project.root / ".hybridflow")
    assert stages["work"]["status"] == "done" and stages["work"]["attempts"] == 3
    assert stages["work"]["skip_reason"] == "never run; succeeded on attempt 3"
    log = Path(stages["work"]["log_path"]).read_text()
    assert "attempt 1 of 3 failed: ConnectionError: the source hung up (try 1)" in log
    assert "attempt 2 of 3 failed" in log and "retrying in 0.4s" in log  # the delay doubles

    counter.write_text("-5")  # fails on every try from now on
    text = (project.root / "pipeline.yaml").read_text().replace("retries: 2", "retries: 1")
    (project.root / "pipeline.yaml").write_text(text)
    failed = run(project, "--force", "work")
    assert failed.returncode == 1
    _, stages = last_run_record(project.root / ".hybridflow")
    assert stages["work"]["status"] == "failed" and stages["work"]["attempts"] == 2
    assert assert_complete(Catalog(project.home("faults")), "result", 10) == 0  # the good one stays


def test_two_concurrent_runs_never_overlap(project):
    gate = project.root / "gate"  # the first run's stage holds its run open until this file exists
    pipeline(project, "python", "gated", work=f'params: {{gate: "{gate}"}}')
    first, marker = start(project)
    try:
        wait_for(stage_log_says(project, "calling mypkg.steps:gated"), "the first run's stage", first)
        holder, _ = last_run_record(project.root / ".hybridflow")
        refused = run(project)
        assert refused.returncode == 75, refused.stdout + refused.stderr
        assert f"another run of this pipeline is in progress (run {holder['run_id']} started " in refused.stderr
        waiting, _ = start(project, "--wait", "--force")
        wait_for(lambda: blocked_on_a_lock(waiting.pid), "the --wait run to block on the first run's lock",
                 waiting, 180)
        assert first.poll() is None, "the first run ended before its gate was opened"
    finally:
        gate.touch()  # never leave the first run waiting, even when an assertion above failed
    for name, process in (("first", first), ("--wait", waiting)):
        try:
            rc = process.wait(180)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the {name} run did not end within 180 s of the gate opening")
        assert rc == 0, f"the {name} run: {process.stdout.read()}"
    runs = RunStore(project.root / ".hybridflow" / "runs.db").runs("faults")
    assert [r["status"] for r in runs] == ["success", "success"]  # the refused one never started
    assert runs[0]["started_at"] >= runs[1]["ended_at"]  # the waiting run began after the first ended
    assert_nothing_left(marker, 60)
