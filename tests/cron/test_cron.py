"""End to end: the real cron daemon runs an installed schedule in its bare environment (about a minute)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from hybridflow.definition.config import load_pipeline
from hybridflow.ops import schedule
from hybridflow.ops.doctor import cron_daemon
from hybridflow.store.state import RunStore
from tests.support.crontabs import TINY_STAGES, crontab_bytes, tiny_pipeline

# cron reads a changed crontab at its next minute and runs the job then (at most ~2 minutes), and the
# run itself needs time on a loaded machine
WAIT = 240


@pytest.fixture
def running_cron(tmp_path):
    """A running cron daemon: the machine's own, or `cron -f` started here and stopped by its process id."""
    if cron_daemon() is not None:
        yield
        return
    binary = shutil.which("cron") or ("/usr/sbin/cron" if os.access("/usr/sbin/cron", os.X_OK) else None)
    if binary is None:
        pytest.skip("the cron daemon is not installed (apt-get install cron)")
    if os.geteuid() != 0:
        pytest.skip("starting the cron daemon needs root")
    errors = tmp_path / "cron.stderr"
    with errors.open("wb") as sink:
        daemon = subprocess.Popen([binary, "-f"], stdout=sink, stderr=sink)
    try:
        time.sleep(1)
        if daemon.poll() is not None:
            pytest.skip(f"cron -f could not run here: {errors.read_text().strip() or daemon.returncode}")
        yield
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def test_cron_runs_the_installed_schedule(project, saved_crontab, running_cron):
    project.stages(TINY_STAGES)
    # a zone other than the system's: the line fires every minute and --if-due lets the run through
    path = project.pipeline(tiny_pipeline("* * * * *", "Asia/Kathmandu"))
    entry = schedule.install(load_pipeline(path))
    store = RunStore(project.root / ".hybridflow" / "runs.db")
    deadline = time.monotonic() + WAIT
    log = project.root / ".hybridflow" / "tiny" / "cron.log"
    while time.monotonic() < deadline:  # the run's summary reaches the log after its record is final
        if any(r["trigger"] == "cron" and r["status"] == "success" for r in store.runs()) and \
                log.exists() and "success" in log.read_text():
            break
        time.sleep(2)
    assert any(r["trigger"] == "cron" and r["status"] == "success" for r in store.runs()), (
        f"no successful cron run within {WAIT}s; {log}: {log.read_text() if log.exists() else '(none)'}")
    schedule.remove(str(path))
    assert crontab_bytes() == (saved_crontab or b"")
    assert entry.log == str(log) and "success" in log.read_text()
