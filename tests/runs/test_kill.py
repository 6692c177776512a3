"""SIGKILL a real run at every step of publishing, and at random moments: the last published
version must stay complete and readable, and the next run must go through."""

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hybridflow.store.catalog import Catalog
from tests.support.projects import last_run_record

STAGE = '''
import pandas as pd


def make(generation: int, rows: int):
    n = rows + generation
    return {
        "table": pd.DataFrame({"gen": [generation] * n, "i": range(n), "pad": ["x" * 20] * n}),
        "second": pd.DataFrame({"gen": [generation]}),
    }
'''

PIPELINE = '''
name: killme
params: {generation: 0, rows: 1000}
stages:
  make: {run: "mypkg.steps:make", outputs: [table, second]}
'''


def start(path, generation, rows=1000, crash_at=None):
    env = dict(os.environ)
    env.pop("HYBRIDFLOW_CRASH_AT", None)
    if crash_at:
        env["HYBRIDFLOW_CRASH_AT"] = crash_at
    return subprocess.Popen([sys.executable, "-m", "hybridflow.cli", "run", str(path),
                             "--param", f"generation={generation}", "--param", f"rows={rows}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def assert_complete(catalog: Catalog, dataset: str, rows: int) -> int:
    """The current version is whole: every file matches its manifest, and its rows are one generation."""
    version = catalog.current(dataset)
    for entry in version.manifest["files"]:
        data = (version.directory / entry["path"]).read_bytes()
        assert len(data) == entry["size"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
    table = pq.read_table([str(f) for f in version.files])
    generations = set(table.column("gen").to_pylist())
    assert len(generations) == 1, generations
    generation = generations.pop()
    if dataset == "table":
        assert table.num_rows == version.rows == rows + generation
    return generation


@pytest.mark.parametrize("crash_at, survivor", [
    ("publish:staged", 1), ("publish:moved", 1), ("publish:journal", 2), ("publish:committed", 2),
])
def test_sigkill_during_publish_keeps_a_complete_version(project, crash_at, survivor):
    """The stage's two outputs become current together: a kill before the commit journal leaves
    both old, one after it (even between the two CURRENT pointers) both new."""
    project.stages(STAGE)
    path = project.pipeline(PIPELINE)
    catalog = Catalog(project.home("killme"))
    first = start(path, 1)
    assert first.wait(180) == 0, first.stderr.read()
    killed = start(path, 2, crash_at=crash_at)
    # the run's process is killed; the command that supervises it records the run and says so
    assert killed.wait(180) == 1
    assert "its process died (killed by SIGKILL" in killed.stderr.read().decode()
    assert assert_complete(catalog, "table", 1000) == survivor
    assert assert_complete(catalog, "second", 1000) == survivor
    assert any((project.home("killme") / "staging").iterdir())  # the dead run left its staging behind
    # The kernel released the dead run's lock; the next run proceeds and clears its staging.
    again = start(path, 3)
    assert again.wait(180) == 0, again.stderr.read()
    assert assert_complete(catalog, "table", 1000) == 3
    assert not any((project.home("killme") / "staging").iterdir())


def test_sigkill_at_random_moments_never_exposes_a_partial_version(project):
    project.stages(STAGE)
    path = project.pipeline(PIPELINE)
    catalog = Catalog(project.home("killme"))
    rows = 300_000
    clock = time.monotonic()
    first = start(path, 1, rows)
    assert first.wait(180) == 0, first.stderr.read()
    took = time.monotonic() - clock  # the kills' moments scale with this machine's speed
    rng = random.Random(1234)
    for generation in range(2, 10):
        before = catalog.current("table").id
        run = start(path, generation, rows)
        if generation % 3 == 1:  # right after a commit is seen, whatever the machine's speed
            deadline = time.monotonic() + 180
            while catalog.current("table").id == before and run.poll() is None:
                assert time.monotonic() < deadline, "no commit within 180 s"
                time.sleep(0.02)
        else:  # anywhere in the run, from its start to about its end
            time.sleep(rng.uniform(0.05, 1.0) * took)
        run.send_signal(signal.SIGKILL)
        run.wait(180)
        current = assert_complete(catalog, "table", rows)
        assert current in {1} | set(range(2, generation + 1))
        assert assert_complete(catalog, "second", rows) == current  # the stage's outputs move together
    final = start(path, 99, rows)
    assert final.wait(180) == 0, final.stderr.read()
    assert assert_complete(catalog, "table", rows) == 99


SLOW = '''
import time
import pandas as pd


def make(generation: int, rows: int):
    return {"table": pd.DataFrame({"gen": [generation] * (rows + generation)}),
            "second": pd.DataFrame({"gen": [generation]})}


def slow(table):
    print("slow stage started", flush=True)
    time.sleep(3600)
    return table
'''


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_sigint_stop_the_run_cleanly(project, signum, code):

    project.stages(SLOW)
    path = project.pipeline(PIPELINE + '  slow: {run: "mypkg.steps:slow", inputs: [table], outputs: [slowed]}\n')
    run = start(path, 1)
    deadline = time.monotonic() + 180
    while not any("slow stage started" in p.read_text() for p in project.home("killme").glob("runs/*/logs/slow.log")):
        assert run.poll() is None, f"the run exited with {run.returncode} before the slow stage started"
        assert time.monotonic() < deadline, "the slow stage did not start within 180 s"
        time.sleep(0.1)
    run.send_signal(signum)
    # The stage sleeps for an hour: a run that waited for it instead of stopping it would not exit in time.
    try:
        rc = run.wait(180)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not exit within 180 s of {signum.name}: "
                    "it waited for its stage instead of stopping it")
    assert rc == code
    record, stages = last_run_record(project.root / ".hybridflow")
    assert record["status"] == "interrupted"
    assert stages["make"]["status"] == "done" and stages["slow"]["status"] == "failed"
    catalog = Catalog(project.home("killme"))
    assert assert_complete(catalog, "table", 1000) == 1 and catalog.current("slowed") is None
    assert not any((project.home("killme") / "staging").iterdir())


def test_a_stop_request_while_the_run_prepares_stops_it_cleanly(project):
    """SIGTERM before any stage started (the run recovering, checking, reaping, starting engines): exit 143
    and a run recorded as interrupted, as during a stage, never a process ended outright."""
    project.stages(SLOW)
    path = project.pipeline(PIPELINE)
    env = {**os.environ, "HYBRIDFLOW_STOP_AT": "run:preparing"}  # the run's process stops itself there
    env.pop("HYBRIDFLOW_CRASH_AT", None)
    run = subprocess.Popen([sys.executable, "-m", "hybridflow.cli", "run", str(path)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (stopped := [pid for pid in processes_below(run.pid) if process_state(pid) == "T"]):
        assert run.poll() is None and time.monotonic() < deadline, "the run never reached run:preparing"
        time.sleep(0.05)
    run.send_signal(signal.SIGTERM)  # what a scheduler or systemd sends to the command
    time.sleep(0.5)  # the command passes it on to the run's process, where it waits until it goes on
    for pid in stopped:
        os.kill(pid, signal.SIGCONT)
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 143, output
    record, stages = last_run_record(project.root / ".hybridflow")
    assert record["status"] == "interrupted", record
    assert stages["make"]["status"] == "not run", stages


def processes_below(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def process_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""
