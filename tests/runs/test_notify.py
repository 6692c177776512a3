"""`notify:` end to end: the real CLI in a subprocess, POSTing to a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hybridflow.errors import ExitCode
from hybridflow.store.lock import RunLock
from tests.unit.test_runner import STAGES

TOKEN = "tok-7f3a9c1e5b"  # what ${env:HOOK_TOKEN} expands to: must never be shown or stored

FAILING = """
name: demo
stages:
  make: {{run: 'mypkg.steps:make', outputs: [numbers, meta]}}
  bad: {{run: 'mypkg.steps:boom', inputs: [numbers], outputs: [y]}}
notify:
{notify}
"""

SUCCEEDING = """
name: demo
stages:
  make: {{run: 'mypkg.steps:make', outputs: [numbers, meta]}}
notify:
{notify}
"""

# Writes its stdin, its HYBRIDFLOW_* variables and its argv to the file named by its first argument.
RECORDER = """
import json, os, sys
record = {"stdin": json.loads(sys.stdin.read()), "argv": sys.argv[1:],
          "env": {k: v for k, v in os.environ.items() if k.startswith("HYBRIDFLOW_")}}
with open(sys.argv[1], "w") as f:
    json.dump(record, f)
"""


@dataclass
class Received:
    path: str
    headers: dict
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


class Hook:
    """A webhook receiver that records every POST and answers with `status`."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.status = 200
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.requests.append(Received(self.path, dict(self.headers), body))
                self.send_response(hook.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):  # keep the test output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    server = Hook()
    yield server
    server.close()


def notify_block(**keys) -> str:
    return "\n".join(f"  {key}: {json.dumps(value)}" for key, value in keys.items())


def hybridflow(project, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOOK_TOKEN": TOKEN}
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *map(str, args)], cwd=project.root, env=env,
                          capture_output=True, text=True, timeout=300)


def stored_bytes(project) -> bytes:
    """Everything the run left on disk: logs, run.json, runs.db (and its WAL), manifests."""
    return b"".join(p.read_bytes() for p in sorted((project.root / ".hybridflow").rglob("*")) if p.is_file())


def test_failed_run_posts_one_summary_and_keeps_its_exit_code(project, hook):
    project.stages(STAGES)
    path = project.pipeline(FAILING.format(notify=notify_block(url=hook.base + "/hooks/ml")))
    done = hybridflow(project, "run", path, "--trigger", "cron")
    assert done.returncode == ExitCode.STAGE_FAILED, done.stderr
    [request] = hook.requests
    assert request.path == "/hooks/ml"
    assert request.headers["Content-Type"] == "application/json"
    summary = request.json()
    assert summary["pipeline"] == "demo" and summary["status"] == "failed" and summary["exit_code"] == 1
    assert summary["trigger"] == "cron" and summary["host"] == socket.gethostname()
    assert summary["pipeline_file"] == str(path)
    [failed] = summary["failed_stages"]
    assert failed["name"] == "bad" and failed["error"].startswith("ValueError: the data is bad: 3 (mypkg/steps.py:")
    assert Path(failed["log_path"]).is_file() and summary["run_id"] in Path(failed["log_path"]).parts
    assert [(s["name"], s["status"]) for s in summary["stages"]] == [("make", "done"), ("bad", "failed")]
    assert summary["error"] == failed["error"]
    assert f"resume with: {summary['resume_command']}" in done.stderr
    assert summary["duration"] > 0 and summary["started_at"].startswith("20")
    assert f"notified by url: POST {hook.base}: HTTP 200" in done.stderr


@pytest.mark.parametrize("on, posts", [(["failure"], 0), (["failure", "success"], 1)])
def test_success_is_only_notified_when_asked(project, hook, on, posts):
    project.stages(STAGES)
    path = project.pipeline(SUCCEEDING.format(notify=notify_block(on=on, url=hook.base)))
    done = hybridflow(project, "run", path)
    assert done.returncode == 0, done.stderr
    assert len(hook.requests) == posts
    if posts:
        summary = hook.requests[0].json()
        assert summary["status"] == "success" and summary["error"] is None and summary["failed_stages"] == []
        assert summary["exit_code"] == 0 and summary["resume_command"] is None


@pytest.mark.parametrize("receiver", ["answers 500", "unreachable"])
def test_undeliverable_url_warns_without_its_secret(project, hook, receiver):
    if receiver == "answers 500":
        hook.status = 500
        base = hook.base
    else:
        with socket.socket() as free:  # a port nothing listens on
            free.bind(("127.0.0.1", 0))
            base = f"http://127.0.0.1:{free.getsockname()[1]}"
    project.stages(STAGES)
    path = project.pipeline(FAILING.format(notify=notify_block(url=base + "/x/${env:HOOK_TOKEN}?k=${env:HOOK_TOKEN}",
                                                               timeout="5s")))
    done = hybridflow(project, "run", path)
    assert done.returncode == ExitCode.STAGE_FAILED, done.stderr  # the run's outcome, not the notifier's
    warning = [line for line in done.stderr.splitlines() if "notification by url failed" in line]
    assert len(warning) == 1 and f"POST {base} failed after 3 attempts" in warning[0]
    if receiver == "answers 500":
        assert "HTTP 500" in warning[0]
        assert [r.path for r in hook.requests] == [f"/x/{TOKEN}?k={TOKEN}"] * 3  # it did use the secret URL
    for text in (done.stdout, done.stderr):
        assert TOKEN not in text and "/x/" not in text
    assert TOKEN.encode() not in stored_bytes(project)


def test_command_gets_the_summary_on_stdin_and_the_run_in_its_environment(project):
    project.stages(STAGES)
    project.write("notify/record.py", RECORDER)
    # A string command is split like a shell would (the quoted path has a space) but run without one,
    # relative to the pipeline's root.
    command = f"{sys.executable} notify/record.py 'out dir/record.json' --team ml"
    (project.root / "out dir").mkdir()
    path = project.pipeline(FAILING.format(notify=notify_block(command=command)))
    done = hybridflow(project, "run", path)
    assert done.returncode == ExitCode.STAGE_FAILED, done.stderr
    record = json.loads((project.root / "out dir" / "record.json").read_text())
    assert record["argv"] == ["out dir/record.json", "--team", "ml"]
    summary = record["stdin"]
    assert summary["status"] == "failed" and summary["failed_stages"][0]["name"] == "bad"
    assert record["env"] == {"HYBRIDFLOW_RUN_ID": summary["run_id"], "HYBRIDFLOW_STATUS": "failed",
                             "HYBRIDFLOW_PIPELINE": "demo", "HYBRIDFLOW_REPORT": summary["report"]}
    assert summary["report"].endswith(f"/runs/{summary['run_id']}/report.html")  # to attach or upload
    assert Path(summary["report"]).read_text().startswith("<!DOCTYPE html>")
    assert f"notified by command: {Path(sys.executable).name} exited with 0" in done.stderr


def test_failing_command_warns_with_its_stderr_redacted(project):
    project.stages(STAGES)
    script = "import sys; sys.stderr.write('rejected token ' + sys.argv[1] + '\\n'); sys.exit(3)"
    path = project.pipeline(SUCCEEDING.format(notify=notify_block(
        on=["success"], command=[sys.executable, "-c", script, "${env:HOOK_TOKEN}"])))
    done = hybridflow(project, "run", path)
    assert done.returncode == 0, done.stderr
    name = Path(sys.executable).name
    assert f"warning: notification by command failed: {name} exited with 3: rejected token ***" in done.stderr
    assert TOKEN not in done.stdout + done.stderr


def test_command_past_its_timeout_is_killed(project):
    project.stages(STAGES)
    path = project.pipeline(SUCCEEDING.format(notify=notify_block(
        on=["success"], command=[sys.executable, "-c", "import time; time.sleep(3600)"], timeout="1s")))
    # A run that waited for the command instead of killing it would hit hybridflow()'s own timeout.
    done = hybridflow(project, "run", path)
    assert done.returncode == 0, done.stderr
    assert "ran past its 1s timeout and was killed" in done.stderr


def test_run_that_cannot_start_notifies_unless_another_run_holds_the_lock(project, hook):
    project.stages(STAGES)
    path = project.pipeline("""
    name: demo
    datasets:
      events: {path: data/missing.parquet}
    stages:
      use: {run: 'mypkg.steps:use', inputs: [events], outputs: [copy]}
    notify:
      url: %s
    """ % hook.base)
    done = hybridflow(project, "run", path)
    assert done.returncode == ExitCode.DATA, done.stderr
    [request] = hook.requests
    summary = request.json()
    assert summary["status"] == "failed" and summary["exit_code"] == ExitCode.DATA
    assert "external input 'events' of stage 'use' does not exist" in summary["error"]
    assert summary["stages"][0]["status"] == "not run" and summary["run_id"]

    holder = RunLock(project.home("demo") / "run.lock")
    holder.acquire("20260101T000000Z-abcdef")
    try:
        locked = hybridflow(project, "run", path)
    finally:
        holder.release()
    assert locked.returncode == ExitCode.LOCKED, locked.stderr
    assert len(hook.requests) == 1  # still only the first run's notification


def test_url_with_another_scheme_is_a_located_config_error(project):
    project.stages(STAGES)
    path = project.pipeline(FAILING.format(notify=notify_block(url="ftp://hooks.example.com/${env:HOOK_TOKEN}")))
    done = hybridflow(project, "run", path)
    assert done.returncode == ExitCode.CONFIG
    assert f"{path}:6:8: error: notify.url: must be an http:// or https:// URL with a host (scheme 'ftp')" \
        in done.stderr
    assert TOKEN not in done.stderr


def test_a_watch_sessions_runs_notify_as_any_run_does(project):
    """hybridflow.watch makes its runs as hybridflow.run does: the summary reaches the command, once
    the run's record is final and its report written (the notifications subscribe after them)."""
    import hybridflow

    project.stages(STAGES)
    project.write("notify/record.py", RECORDER)
    command = f"{sys.executable} notify/record.py record.json"
    path = project.pipeline(FAILING.format(notify=notify_block(command=command)))
    last = hybridflow.watch(path, runs=1)
    assert last.status == "failed"
    summary = json.loads((project.root / "record.json").read_text())["stdin"]
    assert (summary["run_id"], summary["status"], summary["trigger"]) == (last.run_id, "failed", "manual")
    assert Path(summary["report"]).read_text().startswith("<!DOCTYPE html>")
    [run] = hybridflow.runs(path, limit=1)
    assert run["run_id"] == last.run_id and run["status"] == "failed"
