"""The workdir as a place the user can get wrong: read-only, not theirs to write, removed during a
run, a file, a folder of their own files. Each is one line naming the folder and what to do (exit 74
or 78), never an internal error, and nothing is half-published. Also what hybridflow leaves there: no
temporary file of a writer that died outlives the next run or gc, runs.db is owner-only, and the run's
summary says where its report is."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridflow.cli import app
from hybridflow.store.catalog import Catalog
from hybridflow.store.state import RunStore
from hybridflow.store.workdir import MARKER
from tests.support.projects import Project

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="mounting and changing user need root (CI runs as root)")

STAGES = '''
import os
import shutil
from pathlib import Path

import pandas as pd


def make(rows=3):
    return pd.DataFrame({"a": list(range(rows))})


def copy(a):
    if os.environ.get("HF_TEST_REMOVE_WORKDIR"):  # as a user's `rm -rf .hybridflow` would, mid-run
        shutil.rmtree(Path(__file__).resolve().parents[1] / ".hybridflow")
    return a
'''

PIPELINE = '''
name: demo
stages:
  make: {run: "mypkg.steps:make", outputs: [a]}
  copy: {run: "mypkg.steps:copy", inputs: [a], outputs: [b]}
'''


def hybridflow(root: Path, *args: str, prefix: tuple[str, ...] = (), env: dict | None = None):
    return subprocess.run([*prefix, sys.executable, "-m", "hybridflow.cli", *args], cwd=root, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def assert_one_line(result: subprocess.CompletedProcess, code: int, *parts: str) -> None:
    """Exit `code` and exactly one line about an error, which holds each of `parts`; no traceback."""
    output = result.stdout + result.stderr
    assert result.returncode == code, output
    [line] = [line for line in output.splitlines() if "error" in line.lower()]
    assert line.startswith("error: ") and all(part in line for part in parts), line
    assert "Traceback" not in output, output


def demo(project: Project) -> Path:
    project.stages(STAGES)
    return project.pipeline(PIPELINE)


def read_only(root: Path) -> tuple[str, ...]:
    """A command prefix that runs in a private mount namespace where `root` is mounted read-only,
    with its working directory entered after the mount (a cwd entered before it is still writable)."""
    script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" && cd "$0" && exec "$@"'
    return ("unshare", "-m", "sh", "-c", script, str(root))


# -- 3: the user's cause, not an internal error ------------------------------------------------------------


@AS_ROOT
def test_a_read_only_checkout_is_one_line_naming_the_folder(project):
    demo(project)
    for command in ("plan", "run"):
        result = hybridflow(project.root, command, "pipeline.yaml", prefix=read_only(project.root))
        assert_one_line(result, 74, f"cannot write to {project.root / '.hybridflow'}: {project.root} is on a "
                        "read-only file system", "point workdir: in the pipeline file at a writable folder")
    assert not (project.root / ".hybridflow").exists()


@AS_ROOT
def test_a_read_only_workdir_is_one_line_and_changes_nothing(project):
    demo(project)
    assert hybridflow(project.root, "run", "pipeline.yaml").returncode == 0
    workdir = project.root / ".hybridflow"
    before = sorted(str(p) for p in workdir.rglob("*"))
    current = Catalog(project.home("demo")).current("b").id
    for command in (("plan", "pipeline.yaml"), ("run", "pipeline.yaml", "--force"), ("gc", "pipeline.yaml")):
        result = hybridflow(project.root, *command, prefix=read_only(project.root))
        assert_one_line(result, 74, "read-only file system", str(workdir))
    assert sorted(str(p) for p in workdir.rglob("*")) == before
    assert Catalog(project.home("demo")).current("b").id == current


@pytest.fixture
def shared_project():
    """A project nobody (uid 65534) can read but not write: pytest's tmp_path is root's own (0700)."""
    root = Path(tempfile.mkdtemp(prefix="hf-workdir-"))
    root.chmod(0o755)
    try:
        yield Project(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@AS_ROOT
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is not installed")
def test_a_workdir_the_user_may_not_write_is_one_line_naming_it(shared_project):
    demo(shared_project)
    nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    env = {"HOME": str(shared_project.root)}
    fresh = hybridflow(shared_project.root, "plan", "pipeline.yaml", prefix=nobody, env=env)
    assert_one_line(fresh, 74, f"permission denied on {shared_project.root / '.hybridflow'} ({shared_project.root} "
                    "belongs to root; hybridflow runs as user nobody)", "give user nobody access to it, or point "
                    "workdir: in the pipeline file at a folder user nobody can write to")
    assert hybridflow(shared_project.root, "run", "pipeline.yaml").returncode == 0  # made by root
    theirs = hybridflow(shared_project.root, "run", "pipeline.yaml", "--force", prefix=nobody, env=env)
    assert_one_line(theirs, 74, f"permission denied on {shared_project.root / '.hybridflow'} (it belongs to root")


def test_a_workdir_removed_during_a_run_is_one_line_and_not_made_again(project, monkeypatch):
    path = demo(project)
    monkeypatch.setenv("HF_TEST_REMOVE_WORKDIR", "1")
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 74, result.output
    workdir = project.root / ".hybridflow"
    assert [line for line in result.output.splitlines() if line.startswith("error:")] == [
        f"error: {workdir} was removed while hybridflow was using it; nothing more was published (run again to "
        "start afresh: what it held is gone)"]
    assert "Traceback" not in result.output and "timeline not recorded" not in result.output
    assert not workdir.exists()  # nothing of the stage was published into a workdir made anew
    monkeypatch.delenv("HF_TEST_REMOVE_WORKDIR")
    assert CliRunner().invoke(app, ["run", str(path)]).exit_code == 0  # and the next run starts afresh


@pytest.mark.parametrize("command", ["plan", "run", "gc"])
def test_a_workdir_that_is_a_file_is_a_config_error(project, command):
    path = demo(project)
    (project.root / ".hybridflow").write_text("not a folder")
    result = CliRunner().invoke(app, [command, str(path)])
    assert result.exit_code == 78, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"error: the workdir {project.root / '.hybridflow'} is a file, not a folder (point workdir: in the "
        "pipeline file at a folder (hybridflow makes it))")
    assert (project.root / ".hybridflow").read_text() == "not a folder"


def test_a_workdir_below_a_file_says_where_and_publishes_nothing(project):
    path = demo(project)
    (project.root / "blocked").write_text("a file where a folder should be")
    text = path.read_text().replace("name:", "workdir: blocked/hf\nname:", 1)
    path.write_text(text)
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code in (74, 78), result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: ") and "blocked" in last and "Traceback" not in result.output, result.output
    assert (project.root / "blocked").read_text() == "a file where a folder should be"


# -- 7: what hybridflow leaves in the workdir, and whose folder it is --------------------------------------


def test_a_folder_of_the_users_own_files_is_refused_and_kept(project):
    demo(project)
    path = project.pipeline("workdir: mine\n" + PIPELINE.lstrip())
    theirs = [project.write("mine/demo/staging/notes.txt", "mine"),
              project.write("mine/demo/datasets/a/versions/v1/data.csv", "x\n1\n")]
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 78, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"error: the workdir {project.root / 'mine'} is a folder hybridflow did not make, and it holds demo "
        "(point workdir: in the pipeline file at a new or empty folder: hybridflow deletes what it finds under "
        "its own staging/ and versions/)")
    assert all(file.exists() for file in theirs)
    assert not (project.root / "mine" / "runs.db").exists() and not (project.root / "mine" / MARKER).exists()


def test_hybridflows_own_workdirs_are_taken_with_or_without_the_marker(project):
    path = demo(project)
    workdir = project.root / ".hybridflow"
    workdir.mkdir()
    (workdir / ".gitkeep").write_text("")  # made empty on purpose
    assert CliRunner().invoke(app, ["run", str(path)]).exit_code == 0
    assert (workdir / MARKER).is_file()
    (workdir / MARKER).unlink()  # a workdir from before the marker: known by its runs.db
    assert CliRunner().invoke(app, ["run", str(path), "--force"]).exit_code == 0
    assert (workdir / MARKER).is_file()
    shutil.rmtree(workdir)
    project.write(".hybridflow/demo/cron.log", "")  # a schedule's first run: its cron line made the folder
    assert CliRunner().invoke(app, ["run", str(path)]).exit_code == 0


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def plant_leftovers(project: Project, run_dir: Path, dead: int, live: int) -> tuple[list[Path], list[Path]]:
    """Temporary files as writers that died would leave them (SIGKILL while writing the multi-output
    journal, a full disk while writing the report), and the same names of a writer still alive."""
    home, workdir = project.home("demo"), project.root / ".hybridflow"
    dead_files = [home / f".COMMITTING.{dead}.123456789.tmp", home / "datasets" / "a" / f".CURRENT.{dead}.1.tmp",
                  home / f".hashes.json.{dead}.tmp", workdir / f".fingerprint-key.{dead}.tmp",
                  run_dir / f".report.html.{dead}.partial", run_dir / ".report.html.partial"]
    live_files = [home / f".COMMITTING.{live}.987654321.tmp", run_dir / f".report.html.{live}.partial"]
    for file in dead_files + live_files:
        file.write_bytes(b"x" * 1000)
    return dead_files, live_files


def test_leftover_temporary_files_are_removed_by_the_next_run_and_by_gc(project):
    path = demo(project)
    first = CliRunner().invoke(app, ["run", str(path)])
    assert first.exit_code == 0, first.output
    [run_dir] = (project.home("demo") / "runs").iterdir()
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        for command in (["run", str(path)], ["gc", str(path)]):
            dead, live = plant_leftovers(project, run_dir, dead_pid(), writer.pid)
            result = CliRunner().invoke(app, command)
            assert result.exit_code == 0, result.output
            assert [f for f in dead if f.exists()] == [], command
            assert all(f.exists() for f in live), command  # its writer may still be writing it
            for file in live:
                file.unlink()
    finally:
        writer.kill()
        writer.wait()


def disk_is_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_write_that_fails_leaves_no_temporary_file(project, monkeypatch):
    """A full disk while the report, a pointer or the hash cache is written: the temporary file goes
    at once, so that the disk does not stay full of it."""
    from hybridflow import api
    from hybridflow.data import hashing
    from hybridflow.store import catalog

    path = demo(project)
    result = api.run(path)
    assert result.ok

    out = project.root / "out" / "report.html"
    out.parent.mkdir()
    monkeypatch.setattr(Path, "write_text", disk_is_full)
    with pytest.raises(OSError):
        api.report(result.run_id, path, out=out)
    monkeypatch.undo()
    assert list(out.parent.iterdir()) == []

    monkeypatch.setattr(catalog.os, "fsync", disk_is_full)
    with pytest.raises(OSError):
        catalog._write_durably(project.root / "out" / "CURRENT", "{}")
    monkeypatch.undo()
    assert list(out.parent.iterdir()) == []

    cache = hashing.HashCache(project.root / "out" / "hashes.json")
    cache.sha256(project.root / "pipeline.yaml")
    monkeypatch.setattr(hashing.os, "replace", disk_is_full)
    cache.save()  # best effort: no error, and nothing left
    assert list(out.parent.iterdir()) == []


def test_runs_db_and_its_side_files_are_owner_only(tmp_path):
    old_umask = os.umask(0)  # the mode comes from hybridflow, not from a strict umask
    try:
        store = RunStore(tmp_path / "new" / "runs.db")
        with closing(store._connect()) as db, db:
            db.execute("INSERT INTO runs (run_id, pipeline, trigger, started_at, status) "
                       "VALUES ('r', 'p', 'manual', 'now', 'running')")
            sides = [store.path.with_name("runs.db" + side) for side in ("", "-wal", "-shm")]
            assert all(file.exists() for file in sides)
            assert {file.name: stat.S_IMODE(file.stat().st_mode) for file in sides} == {
                file.name: 0o600 for file in sides}
        old = tmp_path / "old" / "runs.db"  # made before runs.db was owner-only
        old.parent.mkdir()
        with closing(sqlite3.connect(old)) as db:
            db.execute("PRAGMA journal_mode=WAL")
        old.chmod(0o644)
        RunStore(old)
        assert stat.S_IMODE(old.stat().st_mode) == 0o600
    finally:
        os.umask(old_umask)


def test_the_run_summary_says_where_its_report_is(project):
    demo(project)
    result = hybridflow(project.root, "run", "pipeline.yaml")
    assert result.returncode == 0, result.stderr
    [run_dir] = (project.home("demo") / "runs").iterdir()
    report = run_dir / "report.html"
    assert report.is_file()
    assert f"report: {report} (hybridflow report --open opens it)" in result.stdout.splitlines()
    elsewhere = hybridflow(project.root / "mypkg", "run", "../pipeline.yaml", "--force")  # another cwd
    assert f" (hybridflow report -w {project.root / '.hybridflow'} --open opens it)" in elsewhere.stdout


# -- where the workdir is: the pipeline file's workdir:, over it HYBRIDFLOW_WORKDIR, over that --workdir ------


def test_workdir_option_and_variable_move_every_record_and_version_and_the_option_wins(project, tmp_path):
    demo(project)
    from_variable = tmp_path / "from-variable"
    done = hybridflow(project.root, "run", "pipeline.yaml", env={"HYBRIDFLOW_WORKDIR": str(from_variable)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (from_variable / "runs.db").exists() and Catalog(from_variable / "demo").current("b") is not None
    assert not (project.root / ".hybridflow").exists()
    # the same variable finds those records again: the run is skipped, and `runs` lists both runs
    again = hybridflow(project.root, "run", "pipeline.yaml", env={"HYBRIDFLOW_WORKDIR": str(from_variable)})
    assert again.returncode == 0 and "skipped" in again.stdout, again.stdout + again.stderr
    listed = hybridflow(project.root, "runs", env={"HYBRIDFLOW_WORKDIR": str(from_variable)})
    assert listed.returncode == 0 and listed.stdout.count("success") == 2, listed.stdout + listed.stderr

    relative = hybridflow(project.root, "run", "pipeline.yaml", "--workdir", "from-option",
                          env={"HYBRIDFLOW_WORKDIR": str(from_variable)})
    assert relative.returncode == 0, relative.stdout + relative.stderr
    assert Catalog(project.root / "from-option" / "demo").current("b") is not None  # relative to the current dir
    assert len(RunStore(from_variable / "runs.db").runs()) == 2
    forced = hybridflow(project.root, "run", "pipeline.yaml", "--force", "-w", "from-option")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    collected = hybridflow(project.root, "gc", "pipeline.yaml", "--keep", "1", "-w", "from-option")
    assert collected.returncode == 0 and "removed 2 versions" in collected.stdout, collected.stdout + collected.stderr
    assert len(RunStore(from_variable / "runs.db").runs()) == 2 and not (project.root / ".hybridflow").exists()


def test_a_workdir_uri_without_a_bucket_is_one_line_naming_where_it_came_from(project):
    demo(project)
    for args, env, where in ((("--workdir", "s3://"), {}, "HYBRIDFLOW_WORKDIR"),
                             ((), {"HYBRIDFLOW_WORKDIR": "s3:///prefix"}, "HYBRIDFLOW_WORKDIR")):
        done = hybridflow(project.root, "run", "pipeline.yaml", *args, env=env)
        assert done.returncode == 78, done.stdout + done.stderr
        assert where in done.stderr and "names no bucket" in done.stderr and "Traceback" not in done.stderr
    project.pipeline(PIPELINE + "workdir: s3://\n")
    done = hybridflow(project.root, "run", "pipeline.yaml")
    assert done.returncode == 78 and "pipeline.yaml:5:" in done.stderr and "names no bucket" in done.stderr, done.stderr
    assert sorted(p.name for p in project.root.iterdir()) == ["mypkg", "pipeline.yaml"]
