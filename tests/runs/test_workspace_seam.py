"""A Runner reads, publishes, locks and records through the workspace it is given, and nowhere else:
one elsewhere on disk holds every trace of the runs, and one whose lock lives in this process (here a
lease lost before the commit) decides whether the run may publish, as a lease in object storage does."""

from __future__ import annotations

from hybridflow.definition.config import load_pipeline
from hybridflow.errors import ExitCode
from hybridflow.execution.runner import Runner
from hybridflow.results import RunOptions
from hybridflow.store.catalog import Catalog
from hybridflow.store.lock import LeaseLost
from hybridflow.store.state import RunStore
from hybridflow.store.workspace import Workspace

STAGES = '''
import pandas as pd


def make(n, token):
    return pd.DataFrame({"id": range(n)})


def double(numbers):
    return numbers.assign(twice=numbers["id"] * 2)


def slow(numbers):
    import time

    time.sleep(60)  # the lease is lost meanwhile
    return numbers
'''

PIPELINE = '''
name: seam
params: {n: 3, token: "${env:SEAM_TOKEN}"}
stages:
  make: {run: mypkg.steps:make, outputs: [numbers]}
  double: {run: mypkg.steps:double, inputs: [numbers], outputs: [doubled]}
'''


class LeaseInThisProcess:
    """A pipeline lock held in memory: taken and given back by run id, and lost on demand."""

    def __init__(self) -> None:
        self.holder: str | None = None
        self.taken: list[str] = []
        self.lost = False
        self.confirmed = 0

    def acquire(self, run_id: str, wait: bool = False) -> None:
        assert self.holder is None, f"held by {self.holder}"
        self.holder = run_id
        self.taken.append(run_id)

    def confirm(self) -> None:
        self.confirmed += 1
        if self.lost:
            raise LeaseLost(f"the lease of run {self.holder} was taken over")

    def on_lost(self, stop) -> None:
        self.stop = stop

    def release(self) -> None:
        self.holder = None


class WorkspaceWithLease(Workspace):
    def __init__(self, *args, lease: LeaseInThisProcess, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lease = lease

    def lock(self) -> LeaseInThisProcess:
        return self.lease


def test_a_runner_given_a_workspace_reads_publishes_and_records_only_there(project, tmp_path, monkeypatch):
    monkeypatch.setenv("SEAM_TOKEN", "seam-secret-1")
    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    elsewhere = tmp_path / "elsewhere"

    pipeline = load_pipeline(path)
    first = Runner(pipeline, workspace=Workspace(elsewhere, pipeline=pipeline)).run()
    assert first.status == "success", first.error
    assert not (project.root / ".hybridflow").exists()  # the pipeline's own workdir is never touched
    doubled = Catalog(elsewhere / "seam").current("doubled")
    assert doubled is not None and doubled.rows == 3
    assert RunStore(elsewhere / "runs.db").last_run("seam")["run_id"] == first.run_id
    assert (elsewhere / ".fingerprint-key").is_file()  # the secret param is fingerprinted with its key
    assert (elsewhere / "seam" / "runs" / first.run_id / "logs" / "make.log").is_file()

    pipeline = load_pipeline(path)
    again = Runner(pipeline, workspace=Workspace(elsewhere, pipeline=pipeline)).run()
    assert {s: r.status for s, r in again.stages.items()} == {"make": "skipped", "double": "skipped"}
    assert not (project.root / ".hybridflow").exists()


def test_a_lease_lost_before_the_commit_publishes_nothing_and_fails_the_run(project, tmp_path, monkeypatch):
    monkeypatch.setenv("SEAM_TOKEN", "seam-secret-1")
    project.stages(STAGES)
    path = project.pipeline(PIPELINE)
    lease = LeaseInThisProcess()

    def workspace(pipeline):
        return WorkspaceWithLease(tmp_path / "held", pipeline=pipeline, lease=lease)

    pipeline = load_pipeline(path)
    done = Runner(pipeline, workspace=workspace(pipeline)).run()
    assert done.status == "success" and lease.taken == [done.run_id] and lease.holder is None
    assert lease.confirmed >= 2  # before each stage's commit at least
    published = Catalog(tmp_path / "held" / "seam").current("numbers").id

    lease.lost = True
    pipeline = load_pipeline(path)
    lost = Runner(pipeline, RunOptions(force=True), workspace=workspace(pipeline)).run()
    assert lost.status == "failed" and lost.error.exit_code == ExitCode.LOCKED, lost.error
    assert "taken over" in lost.error.one_line()
    assert Catalog(tmp_path / "held" / "seam").current("numbers").id == published  # nothing published
    assert lease.holder is None  # given back all the same
    assert RunStore(tmp_path / "held" / "runs.db").run(lost.run_id)["status"] == "failed"


def test_a_lease_lost_while_a_stage_runs_stops_the_run_at_once(project, tmp_path, monkeypatch):
    import threading
    import time

    monkeypatch.setenv("SEAM_TOKEN", "seam-secret-1")
    project.stages(STAGES)
    path = project.pipeline(PIPELINE.replace("outputs: [doubled]}", "outputs: [doubled]}\n"
                                             "  slow: {run: mypkg.steps:slow, inputs: [numbers], outputs: [late]}"))
    lease = LeaseInThisProcess()
    pipeline = load_pipeline(path)
    runner = Runner(pipeline, workspace=WorkspaceWithLease(tmp_path / "held", pipeline=pipeline, lease=lease))
    log = tmp_path / "held" / "seam" / "runs"

    def lose_it_once_slow_runs() -> None:
        deadline = time.monotonic() + 60
        while not list(log.glob("*/logs/slow.log")) and time.monotonic() < deadline:
            time.sleep(0.05)
        # told only through on_lost: confirm() still passes, so a run that did not stop would publish
        lease.stop(LeaseLost("the lease was taken over by run 20261128T000000Z-other"))

    threading.Thread(target=lose_it_once_slow_runs, daemon=True).start()
    lost = runner.run()
    assert lost.status == "failed" and isinstance(lost.error, LeaseLost), lost.error
    assert lost.stages["slow"].status == "failed" and "taken over" in lost.stages["slow"].error
    assert Catalog(tmp_path / "held" / "seam").current("late") is None
    assert lease.holder is None
