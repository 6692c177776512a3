"""The calendar under the real cron daemon: a tick missed while cron was not running is caught up by
the next scheduled invocation, and a schedule held after a failed run records its ticks instead of
running them until it is released (several minutes: cron fires on minute boundaries)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import hybridflow
from hybridflow.definition.config import load_pipeline
from hybridflow.ops import schedule
from hybridflow.ops.doctor import cron_daemon
from hybridflow.store.state import RunStore
from tests.support.crontabs import crontab_bytes, set_crontab, tiny_pipeline

WAIT = 240  # cron reads a changed crontab at its next minute; the run needs time on a loaded machine
SOURCE = Path(hybridflow.__file__).resolve().parent.parent  # the tree under test, which cron's runs import

STAGES = '''
import os

import pandas as pd


def make(ctx):
    if os.path.exists("FAIL"):
        raise RuntimeError("the delivery is broken")
    return pd.DataFrame({"for": [ctx.scheduled_for.isoformat()]})
'''


def every_minute(name: str, on_failure: str = "continue") -> str:
    # tiny_pipeline ends inside its schedule block: the policy goes on there, the notifier after it
    return tiny_pipeline("* * * * *", "UTC", name) + f'''  on_failure: {on_failure}
    notify:
      command: ["sh", "-c", "cat > notified-$HYBRIDFLOW_STATUS.json"]
    '''


class CronDaemon:
    """`cron -f`, started and stopped here by its process id (only where no cron daemon runs already)."""

    def __init__(self, log: Path) -> None:
        self.log, self.process = log, None

    def start(self) -> None:
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen([_cron_binary(), "-f"], stdout=sink, stderr=sink)
        time.sleep(1)
        if self.process.poll() is not None:
            pytest.skip(f"cron -f could not run here: {self.log.read_text().strip() or self.process.returncode}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def _cron_binary() -> str:
    return shutil.which("cron") or "/usr/sbin/cron"


@pytest.fixture
def cron(tmp_path, saved_crontab):
    """A cron daemon this test starts and stops; the crontab gives cron's runs this tree's hybridflow."""
    if cron_daemon() is not None:
        pytest.skip("a cron daemon already runs here: this test must stop and start its own")
    if not os.access(_cron_binary(), os.X_OK) or os.geteuid() != 0:
        pytest.skip("starting the cron daemon needs it installed (apt-get install cron) and root")
    set_crontab(f"PYTHONPATH={SOURCE}\n".encode())
    daemon = CronDaemon(tmp_path / "cron.stderr")
    try:
        yield daemon
    finally:
        daemon.stop()


def by_hand(project, path: Path, *args: str) -> subprocess.CompletedProcess:
    """What cron's line runs at a tick, run now from this process."""
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "--trigger", "cron", str(path), *args],
                          cwd=project.root, capture_output=True, text=True, timeout=300)


def wait_for(store: RunStore, log: Path, found) -> dict:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        run = next((r for r in store.runs(limit=50) if found(r)), None)
        if run is not None and run["status"] != "running":
            return run
        time.sleep(2)
    pytest.fail(f"cron made no such run within {WAIT}s; {log}: {log.read_text() if log.exists() else '(none)'}")


def notified(path: Path) -> dict:
    """The summary the notifier wrote: it runs once the run's record is final, so it may come after it."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):  # not there yet, or not yet written whole
            return json.loads(path.read_text())
        time.sleep(0.5)
    pytest.fail(f"no notification in {path} within {WAIT}s")


def test_a_tick_missed_while_cron_was_stopped_is_caught_up(project, cron):
    project.stages(STAGES)
    path = project.pipeline(every_minute("weekly"))
    store = RunStore(project.root / ".hybridflow" / "runs.db")
    # the last tick cron served, three minutes ago: no cron daemon ran since (the fixture starts the
    # only one), so the ticks after it passed unserved
    past = (datetime.now(timezone.utc) - timedelta(minutes=3)).replace(second=0, microsecond=0)
    first = by_hand(project, path, "--for", past.isoformat())
    assert first.returncode == 0, first.stderr
    [served] = store.runs()
    assert served["scheduled_for"] == past.isoformat()
    entry = schedule.install(load_pipeline(path))
    cron.start()
    log = Path(entry.log)
    caught = wait_for(store, log, lambda r: r["run_id"] != served["run_id"] and r["trigger"] == "cron")
    assert caught["status"] == "success", log.read_text()
    notes = json.loads(caught["calendar"])
    missed = [datetime.fromisoformat(t) for t in notes["missed"]]
    served_at, caught_for = (datetime.fromisoformat(r["scheduled_for"]) for r in (served, caught))
    assert len(missed) >= 2 and missed[0] == served_at + timedelta(minutes=1), notes
    assert all(served_at < t <= caught_for for t in missed) and caught_for.second == 0, (served, caught)
    assert missed == [served_at + timedelta(minutes=i + 1) for i in range(len(missed))]
    shown = subprocess.run([sys.executable, "-m", "hybridflow.cli", "show", caught["run_id"], "--pipeline", str(path)],
                           cwd=project.root, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "COLUMNS": "250"})
    assert "caught up by this run" in shown.stdout, shown.stdout
    # and at boot, cron runs the same catch-up: the @reboot line install added
    assert entry.reboot.startswith("@reboot ") and "--if-due" in entry.reboot
    assert entry.reboot in crontab_bytes().decode()


def test_a_held_schedule_records_its_ticks_until_released(project, cron):
    project.stages(STAGES)
    (project.root / "FAIL").touch()
    path = project.pipeline(every_minute("held", on_failure="hold"))
    store = RunStore(project.root / ".hybridflow" / "runs.db")
    failed = by_hand(project, path)
    assert failed.returncode != 0
    [broken] = store.runs()
    entry = schedule.install(load_pipeline(path))
    cron.start()
    log = Path(entry.log)
    held = wait_for(store, log, lambda r: r["status"] == "held")
    assert held["error"] == f"held: run {broken['run_id']} failed on {broken['started_at'][:16].replace('T', ' ')}"
    assert store.stages(held["run_id"]) == []  # nothing ran
    summary = notified(project.root / "notified-held.json")
    assert summary["status"] == "held" and summary["error"] == held["error"]
    assert [r["status"] for r in store.runs() if r["status"] not in ("held",)] == ["failed"]  # no run went ahead
    (project.root / "FAIL").unlink()
    released = subprocess.run([sys.executable, "-m", "hybridflow.cli", "schedule", "release", str(path)],
                              cwd=project.root, capture_output=True, text=True, timeout=120)
    assert released.returncode == 0 and broken["run_id"] in released.stdout, released.stderr
    ran = wait_for(store, log, lambda r: r["trigger"] == "cron" and r["status"] not in ("held", "failed"))
    assert ran["status"] == "success", log.read_text()
