"""Clusters brought up for a run with the `command` provider: the team's own `up` and `down` scripts,
here starting a real Dask scheduler and worker on 127.0.0.1 (as `terraform apply` or `kubectl apply`
would elsewhere) and stopping them by the process ids `up` printed. The cluster is up for the Dask
stage and taken down while the stage after it runs; a run stopped by SIGTERM or SIGINT, or failed by
a stage timeout, takes it down too; a failing `up` is one line, exit 69, with `down` run
and nothing recorded; a runner killed with SIGKILL leaves a record that `clusters list` shows and
`clusters reap` acts on; a `down` that hangs is bounded and reported."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hybridflow.errors import ExitCode
from hybridflow.store.catalog import Catalog
from tests.support.projects import Project

pytestmark = pytest.mark.timeout(300)
BIN = Path(sys.executable).parent

UP = r'''set -euo pipefail
dir="$STATE/$HYBRIDFLOW_RUN_ID"
mkdir -p "$dir"
echo "$dir" > "$STATE/latest"
echo "bringing up $HYBRIDFLOW_CLUSTER_NAME"
setsid "$BIN/dask" scheduler --host 127.0.0.1 --port 0 --no-dashboard --idle-timeout 300 \
    --scheduler-file "$dir/scheduler.json" > "$dir/scheduler.log" 2>&1 < /dev/null &
echo $! > "$dir/scheduler.pid"
for _ in $(seq 300); do [ -s "$dir/scheduler.json" ] && break; sleep 0.1; done
PYTHONPATH="${WORKER_PYTHONPATH:-}" setsid "$BIN/dask" worker --scheduler-file "$dir/scheduler.json" \
    --host 127.0.0.1 --nworkers 1 --nthreads 1 \
    --no-dashboard > "$dir/worker.log" 2>&1 < /dev/null &
echo $! > "$dir/worker.pid"
address=$("$BIN/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["address"])' "$dir/scheduler.json")
echo "{\"address\": \"$address\", \"state\": \"$dir\", \"nodes\": 2}"
'''

DOWN = r'''set -eu
dir=$("$BIN/python" -c 'import json, os; print(json.loads(os.environ["HYBRIDFLOW_CLUSTER"])["state"])')
for name in worker scheduler; do
    pid=$(cat "$dir/$name.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
done
echo down >> "$dir/downs"
'''

ALIVE = '''alive() { [ -e "/proc/$1" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat"; }\n'''

STAGES = '''
import os
from pathlib import Path

import pandas as pd


def make():
    return pd.DataFrame({"id": pd.Series(range(100), dtype="int64")})


def double(numbers):
    return numbers.assign(doubled=numbers["id"] * 2)


def slow_double(numbers):
    import time
    time.sleep(600)
    return double(numbers)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def after(doubled):
    """Whether the Dask cluster is still up, given 60 s while this stage runs: it is taken down
    beside this stage, which does not wait for it."""
    import time

    state = Path(Path(os.environ["STATE"], "latest").read_text().strip())
    pids = [int((state / f"{name}.pid").read_text()) for name in ("scheduler", "worker")]
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return doubled.assign(cluster_alive=any(alive(pid) for pid in pids))
'''

PIPELINE = '''
name: provisioned
backends:
  dask:
    cluster:
      provider: command
      up: bash {up}
      down: bash {down}
      down_timeout: {down_timeout}
stages:
  make: {{run: "mypkg.steps:make", outputs: [numbers]}}
  double: {{run: "mypkg.steps:{double}", backend: dask, inputs: [numbers], outputs: [doubled]{timeout}}}
  after: {{run: "mypkg.steps:after", inputs: [doubled], outputs: [checked]}}
'''


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def provisioned(tmp_path):
    project = Project(tmp_path / "project")
    project.stages(STAGES)
    state = tmp_path / "state"
    state.mkdir()
    (project.root / "up.sh").write_text(UP)
    (project.root / "down.sh").write_text(ALIVE + DOWN)
    (project.root / "hang.sh").write_text("sleep 600\n")
    (project.root / "fail.sh").write_text('echo "signing in with $CLOUD_TOKEN"; ps -eo args > "$STATE/ps"\n'
                                          'echo "quota exceeded for m5.xlarge in eu-west-1" >&2\n'
                                          'touch "$STATE/up-failed"; exit 3\n')
    (project.root / "down-after-failure.sh").write_text('touch "$STATE/down-after-failure"\n')
    started: list[subprocess.Popen] = []

    def hf(*args: str, wait: bool = True, env: dict | None = None):
        env = {**os.environ, "STATE": str(state), "BIN": str(BIN), "COLUMNS": "300", **(env or {})}
        process = subprocess.Popen([sys.executable, "-m", "hybridflow.cli", *args], cwd=project.root, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        started.append(process)
        if not wait:
            return process
        output, _ = process.communicate(timeout=240)
        return subprocess.CompletedProcess(process.args, process.returncode, output, "")

    yield project, state, hf
    for process in started:  # a test that failed half-way leaves nothing running
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    for pid_file in state.glob("*/*.pid"):
        pid = int(pid_file.read_text())
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def pipeline(project: Project, up: str = "up.sh", down: str = "down.sh", down_timeout: int = 30,
             double: str = "double", timeout: str | None = None) -> None:
    project.pipeline(PIPELINE.format(up=up, down=down, down_timeout=down_timeout, double=double,
                                     timeout=f", timeout: {timeout}" if timeout else ""))


def records(project: Project) -> list[dict]:
    folder = project.home("provisioned") / "clusters"
    return [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def cluster_pids(state: Path) -> list[int]:
    return [int(f.read_text()) for f in sorted(state.glob("*/*.pid"))]


def test_a_dask_cluster_is_brought_up_for_its_stage_and_gone_before_the_next(provisioned):
    project, state, hf = provisioned
    pipeline(project)
    planned = hf("plan", "pipeline.yaml")
    assert "would bring up a dask cluster (command: bash up.sh)" in planned.stdout, planned.stdout
    run = hf("run", "pipeline.yaml")
    assert run.returncode == 0, run.stdout
    checked = pq.read_table([str(f) for f in Catalog(project.home("provisioned")).current("checked").files
                             if f.suffix == ".parquet"]).to_pandas()
    assert sorted(checked["doubled"]) == [2 * i for i in range(100)]
    assert not checked["cluster_alive"].any()  # taken down while the stage after the Dask one ran
    pids = cluster_pids(state)
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)
    cluster_dir = Path((state / "latest").read_text().strip())
    assert "Receive client connection" in (cluster_dir / "scheduler.log").read_text()  # the stage ran there
    assert (cluster_dir / "downs").read_text() == "down\n"  # once
    assert records(project) == []  # the record goes once the cluster is down
    run_id = Path((state / "latest").read_text().strip()).name
    log = next(project.home("provisioned").glob(f"runs/{run_id}/logs/cluster-dask.log")).read_text()
    assert f"bringing up hf-provisioned-{run_id}-dask" in log  # up's own output, with the run's tag
    listed = hf("clusters", "list", "pipeline.yaml")
    assert listed.returncode == 0 and "no cluster" in listed.stdout, listed.stdout

    # what the cluster cost: up, busy (the Dask stage), idle, down and node-seconds (2 nodes, as up said)
    shown = hf("show", "last", "-f", "pipeline.yaml")
    row = re.search(r"dask\W+2\W+([\d.]+)s\W+([\d.]+)s\W+([\d.]+)s\W+([\d.]+)s\W+([\d,]+)\W+ok", shown.stdout)
    assert row, shown.stdout
    up, busy, idle, down = (float(row.group(i)) for i in range(1, 5))
    assert up > 0 and busy > 0 and down > 0
    assert abs(int(row.group(5).replace(",", "")) - 2 * (up + busy + idle + down)) <= 1  # shown rounded
    report = Path(hf("report", "last", "-f", "pipeline.yaml").stdout.strip().splitlines()[-1])
    assert "Clusters brought up for the run" in report.read_text()


@pytest.mark.parametrize("how, exit_code", [("SIGTERM", 143), ("SIGINT", 130), ("stage timeout", 124)])
def test_a_run_stopped_or_timed_out_while_its_stage_runs_on_the_cluster_takes_it_down(provisioned, how, exit_code):
    project, state, hf = provisioned
    pipeline(project, double="slow_double", timeout="4s" if how == "stage timeout" else None)
    run = hf("run", "pipeline.yaml", wait=False)
    if how != "stage timeout":
        deadline = time.monotonic() + 120
        while not stage_called(project, "double"):  # the slow stage runs, its engine on the cluster
            assert time.monotonic() < deadline and run.poll() is None, run.communicate()[0] if run.poll() else ""
            time.sleep(0.1)
        if how == "SIGTERM":
            os.kill(run.pid, signal.SIGTERM)  # what a scheduler or systemd sends
        else:
            os.killpg(run.pid, signal.SIGINT)  # Ctrl-C: the terminal's whole foreground group
    output, _ = run.communicate(timeout=120)
    assert run.returncode == exit_code, output
    pids = cluster_pids(state)
    assert len(pids) == 2 and not any(alive(pid) for pid in pids), output
    downs = Path((state / "latest").read_text().strip()) / "downs"
    logs = "".join(f"\n--- {log}\n{log.read_text(errors='replace')[-3000:]}"
                   for log in project.home("provisioned").glob("runs/*/logs/*.log"))
    assert downs.exists() and downs.read_text() == "down\n", output + logs  # its down ran, once
    assert records(project) == []


def stage_called(project: Project, stage: str) -> bool:
    """The run has called the stage's function (its log says so)."""
    return any("calling mypkg.steps:" in log.read_text(errors="replace")
               for log in project.home("provisioned").glob(f"runs/*/logs/{stage}.log"))


def test_an_up_that_fails_is_one_line_exit_69_and_leaves_nothing_behind(provisioned):
    """Its command, a credential expanded in it, is on no command line (`ps` while it ran) and, with
    what it printed, in no log."""
    project, state, hf = provisioned
    token = "cloud-token-8f2e61c0d9"
    project.pipeline(PIPELINE.format(up="fail.sh", down="down-after-failure.sh", down_timeout=30, double="double",
                                     timeout="").replace("up: bash fail.sh",
                                                         "up: CLOUD_TOKEN=${env:CLOUD_TOKEN} bash fail.sh || exit $?"))
    run = hf("run", "pipeline.yaml", env={"CLOUD_TOKEN": token})
    assert run.returncode == ExitCode.UNAVAILABLE, run.stdout
    assert "the dask cluster's `up` exited 3: quota exceeded for m5.xlarge in eu-west-1" in run.stdout, run.stdout
    assert "Traceback" not in run.stdout
    logs = next(project.root.rglob("cluster-dask.log")).read_text()
    assert "signing in with" in logs and token not in logs and token not in run.stdout
    assert "bash fail.sh" in (state / "ps").read_text() and token not in (state / "ps").read_text()
    assert (state / "up-failed").exists() and (state / "down-after-failure").exists()  # down cleans up after it
    assert records(project) == []
    assert Catalog(project.home("provisioned")).current("doubled") is None


def test_a_worker_running_other_versions_is_refused_before_any_data_moves(provisioned):
    """The worker's pyarrow says it is 1.0.0 (a sitecustomize on its PYTHONPATH): exit 69 naming the worker
    and the version, the cluster taken down, nothing published."""
    project, state, hf = provisioned
    pipeline(project)
    fake = state / "fake"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text("import pyarrow\npyarrow.__version__ = '1.0.0'\n")
    run = hf("run", "pipeline.yaml", env={"WORKER_PYTHONPATH": str(fake)})
    assert run.returncode == ExitCode.UNAVAILABLE, run.stdout
    import pyarrow

    assert re.search(r"the dask cluster at tcp://127\.0\.0\.1:\d+: worker tcp://127\.0\.0\.1:\d+ runs pyarrow "
                     rf"1\.0\.0 \(here {re.escape(pyarrow.__version__)}\)", run.stdout), run.stdout
    assert (Path((state / "latest").read_text().strip()) / "downs").read_text() == "down\n"
    assert records(project) == [] and Catalog(project.home("provisioned")).current("doubled") is None


def test_a_killed_runner_leaves_a_record_that_reap_takes_down_and_a_hanging_down_is_bounded(provisioned):
    project, state, hf = provisioned
    pipeline(project)
    (project.root / "mypkg" / "steps.py").write_text(STAGES.replace(
        "    return numbers.assign(", "    import time\n    time.sleep(600)\n    return numbers.assign("))
    run = hf("run", "pipeline.yaml", wait=False)
    deadline = time.monotonic() + 120
    while not any(r.get("state") == "up" for r in records(project)):
        assert time.monotonic() < deadline and run.poll() is None, run.communicate()[0] if run.poll() else "no up"
        time.sleep(0.2)
    os.killpg(run.pid, signal.SIGKILL)  # the supervisor and the run: nothing of hybridflow tears down
    run.wait()
    pids = cluster_pids(state)
    assert pids and all(alive(pid) for pid in pids)

    listed = hf("clusters", "list", "pipeline.yaml")
    [record] = records(project)
    assert listed.returncode == 0 and record["run_id"] in listed.stdout and "up" in listed.stdout, listed.stdout

    pipeline(project, down="hang.sh", down_timeout=2)  # a down that hangs is killed at its timeout
    clock = time.monotonic()
    hanging = hf("clusters", "reap", "pipeline.yaml")
    assert time.monotonic() - clock < 30
    assert hanging.returncode == ExitCode.UNAVAILABLE, hanging.stdout
    assert "`down` did not finish within 2 s" in hanging.stdout, hanging.stdout
    assert [r["state"] for r in records(project)] == ["down failed"] and all(alive(pid) for pid in pids)

    pipeline(project)
    reaped = hf("clusters", "reap", "pipeline.yaml")
    assert reaped.returncode == 0, reaped.stdout
    assert f"took down the dask cluster of run {record['run_id']}" in reaped.stdout, reaped.stdout
    assert records(project) == [] and not any(alive(pid) for pid in pids)


def test_a_cluster_section_is_checked_where_it_is_written(tmp_path):
    project = Project(tmp_path)
    file = project.pipeline('''
        name: x
        backends:
          dask:
            address: tcp://127.0.0.1:8786
            cluster: {provider: command, up: ./up.sh, down: ./down.sh}
          duckdb:
            cluster: {provider: command, up: ./up.sh, down: ./down.sh}
          ray:
            cluster: {provider: kubernetes, up: ./up.sh, down: ./down.sh}
          spark:
            cluster: {provider: ssh, up: ./up.sh}
        stages:
          a: {run: "m:f", backend: dask, outputs: [o]}
        ''')
    checked = subprocess.run([sys.executable, "-m", "hybridflow.cli", "validate", str(file)], capture_output=True,
                             text=True, cwd=tmp_path)
    assert checked.returncode == ExitCode.CONFIG, checked.stdout + checked.stderr
    said = checked.stdout + checked.stderr
    assert "pipeline.yaml:4:5: error: backends.dask: cluster: brings a cluster up for each run and address: " \
           "attaches to one already running: keep one of them" in said, said
    assert "pipeline.yaml:7:5: error: backends.duckdb: cluster: this engine runs in hybridflow's own process" in said
    assert "backends.ray.cluster.provider must be one of command, ssh, not 'kubernetes'" in said
    assert "backends.spark.cluster: provider: ssh needs hosts" in said


def test_a_watch_session_takes_the_old_cluster_down_when_it_restarts_its_engine(provisioned, tmp_path, monkeypatch):
    """A watch session keeps its engines (and their clusters) between runs, which `clusters reap` (as
    every other run of the pipeline) leaves alone while the session lives; one whose settings changed
    restarts with a fresh cluster, and the old one goes down then, not at the session's end."""
    from hybridflow.api import load
    from hybridflow.execution.provisioning import RunClusters
    from hybridflow.execution.stopping import SignalState
    from hybridflow.execution.warmpool import WarmPool
    from hybridflow.store.workspace import Workspace

    project, state, hf = provisioned
    monkeypatch.setenv("STATE", str(state))
    monkeypatch.setenv("BIN", str(BIN))
    pipeline(project)
    loaded = load(project.root / "pipeline.yaml")
    notices: list[str] = []
    warm = WarmPool(loaded, tmp_path / "logs", notice=notices.append)
    clusters = RunClusters(loaded, "watch-1", tmp_path / "logs", Workspace.of(loaded).cluster_records())
    try:
        logs = tmp_path / "logs"
        warm.for_run(loaded, list(loaded.stages), logs, signals=SignalState(), clusters=clusters).get("dask")
        cluster = Path((state / "latest").read_text().strip())
        first = [int((cluster / f"{name}.pid").read_text()) for name in ("scheduler", "worker")]
        reaped = hf("clusters", "reap", "pipeline.yaml")  # between the session's runs: the lock is free
        assert reaped.returncode == 0 and "took down" not in reaped.stdout, reaped.stdout
        assert all(alive(pid) for pid in first) and len(records(project)) == 1
        pipeline(project, down_timeout=31)  # the cluster section changed: a fresh engine and cluster
        changed = load(project.root / "pipeline.yaml")
        warm.for_run(changed, list(changed.stages), tmp_path / "logs", signals=SignalState()).get("dask")
        assert "restarting dask: its settings changed" in notices
        assert not any(alive(pid) for pid in first) and (cluster / "downs").read_text() == "down\n"
        second = [int((cluster / f"{name}.pid").read_text()) for name in ("scheduler", "worker")]
        assert all(alive(pid) for pid in second) and set(second).isdisjoint(first)
    finally:
        warm.shutdown()
    assert not any(alive(pid) for pid in second) and (cluster / "downs").read_text() == "down\ndown\n"
    assert records(project) == []


def _reap_from_another_machine(project: Project, state: Path) -> subprocess.CompletedProcess:
    """`clusters reap` in a UTS namespace of its own: a machine with another hostname, which cannot ask
    this one whether a process lives."""
    env = {**os.environ, "STATE": str(state), "BIN": str(BIN), "COLUMNS": "300"}
    return subprocess.run(["unshare", "--uts", "sh", "-c", 'hostname another-machine && exec "$@"', "sh",
                           sys.executable, "-m", "hybridflow.cli", "clusters", "reap", "pipeline.yaml"],
                          cwd=project.root, env=env, capture_output=True, text=True, timeout=240)


def _written_again(path: Path, times: int) -> None:
    """Until the file has been written `times` more times (its mtime moved), at most 60 s."""
    seen, deadline = path.stat().st_mtime_ns, time.monotonic() + 60
    while times and time.monotonic() < deadline:
        time.sleep(0.05)
        now = path.stat().st_mtime_ns
        if now != seen:
            seen, times = now, times - 1
    assert times == 0, f"{path} was not written again"


@pytest.mark.skipif(os.geteuid() != 0, reason="a hostname of its own (unshare --uts) needs root")
def test_a_watch_session_keeps_its_clusters_from_a_reaper_on_another_machine_while_it_lives(
        provisioned, tmp_path, monkeypatch):
    """A reaper on another machine cannot see a watch session's process: the session writes its
    clusters' records again (a beat) while it lives, and the reaper leaves them up while the beat is
    younger than a lease length by the store's own clock; once the beat stops for that long (the
    session died with it), the reaper takes the cluster down."""
    from hybridflow.api import load
    from hybridflow.execution.provisioning import RunClusters
    from hybridflow.execution.stopping import SignalState
    from hybridflow.execution.warmpool import WarmPool
    from hybridflow.store.workspace import Workspace

    project, state, _ = provisioned
    monkeypatch.setenv("STATE", str(state))
    monkeypatch.setenv("BIN", str(BIN))
    monkeypatch.setenv("HYBRIDFLOW_LEASE_SECONDS", "3")  # a beat each second; stale after 3 s without
    pipeline(project)
    loaded = load(project.root / "pipeline.yaml")
    warm = WarmPool(loaded, tmp_path / "logs")
    clusters = RunClusters(loaded, "watch-1", tmp_path / "logs", Workspace.of(loaded).cluster_records())
    try:
        logs = tmp_path / "logs"
        warm.for_run(loaded, list(loaded.stages), logs, signals=SignalState(), clusters=clusters).get("dask")
        pids = cluster_pids(state)
        record = project.home("provisioned") / "clusters" / "watch-1-dask.json"
        _written_again(record, 4)  # beyond a lease length since the cluster came up
        kept = _reap_from_another_machine(project, state)
        assert kept.returncode == 0 and "took down" not in kept.stdout, kept.stdout + kept.stderr
        assert all(alive(pid) for pid in pids) and len(records(project)) == 1

        clusters.stop_beating()  # as when the session's machine died
        while time.time() - record.stat().st_mtime < 3.5:
            time.sleep(0.1)
        taken = _reap_from_another_machine(project, state)
        assert taken.returncode == 0 and "took down" in taken.stdout, taken.stdout + taken.stderr
        assert not any(alive(pid) for pid in pids) and records(project) == []
    finally:
        warm.shutdown()
