"""Telling a person how an unattended run ended, as the pipeline's `notify:` section asks.

The run's summary goes as JSON to a URL (POST) and/or to a command's stdin. A notification that
cannot be delivered never changes the run's outcome or exit code: it comes back as a Delivery with
ok=False for the CLI to warn about. Webhook URLs carry tokens, so no detail ever quotes one: every
string is redacted, and a URL is only ever named by its scheme://host.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable
from urllib.parse import urlsplit

from .. import __version__
from ..definition.model import NOTIFY_TIMEOUT, NotifySpec
from ..definition.pipeline import Pipeline
from ..errors import HybridflowError, first_line
from ..results import Listener

if TYPE_CHECKING:  # the runner imports pyarrow; a summary needs none of it
    from ..results import RunResult

RETRY_DELAYS = (0.5, 1.0)  # seconds before each retry of a POST; only connection errors and 5xx are retried


@dataclass(frozen=True)
class Delivery:
    channel: str  # "url" | "command"
    ok: bool
    detail: str  # never holds a secret nor a URL's path or query


class Notifications(Listener):
    """A run's notifications as a subscriber of its events (execution/events.py): once its record is
    final, the summary goes to every channel `notify:` asks for, and each delivery is told to the
    caller's listener. A failed delivery never fails the run."""

    def __init__(self, pipeline: Pipeline, trigger: str, listener: Listener) -> None:
        self.pipeline, self.trigger, self.listener = pipeline, trigger, listener

    def run_finished(self, result: RunResult) -> None:
        self.send(run_summary(self.pipeline, result, self.trigger))

    def send(self, summary: dict[str, Any]) -> None:
        for delivery in deliver(self.pipeline, summary):
            self.listener.notified(delivery)


def wanted(spec: NotifySpec | None, status: str) -> bool:
    """Interrupted runs count as failures: someone should hear that the weekly job did not finish."""
    return spec is not None and ("success" if status == "success" else "failure") in spec.on


def run_summary(pipeline: Pipeline, result: RunResult, trigger: str) -> dict[str, Any]:
    """The JSON summary of a run that returned a result (success, failed or interrupted)."""
    stages = [{"name": s.name, "backend": s.backend, "status": s.status,
               "duration": None if s.duration is None else round(s.duration, 3),
               "error": s.error, "reason": s.reason, "log_path": s.log_path} for s in result.stages.values()]
    from ..reporting.htmlreport import REPORT_FILE

    report = Path(result.run_dir) / REPORT_FILE  # written before the run's listeners hear it ended
    return _summary(pipeline, run_id=result.run_id, status=result.status, trigger=trigger,
                    started_at=result.started_at, duration=result.duration, error=result.error,
                    stages=stages, resume_command=result.resume_command,
                    report=str(report.resolve()) if report.is_file() else None, checks=_checks_of(result))


def _checks_of(result: RunResult) -> list[dict[str, Any]]:
    """The data checks that failed, warned or dropped rows in the run, by stage and dataset."""
    return [{"stage": s.name, "dataset": dataset, **{k: o[k] for k in ("check", "status", "failing", "detail")},
             **({"partition": o["partition"]} if "partition" in o else {})}
            for s in result.stages.values() for dataset, outcomes in s.checks.items()
            for o in outcomes if o["status"] != "passed"]


def failed_start_summary(pipeline: Pipeline, error: HybridflowError, *, run_id: str | None, trigger: str,
                         stages: Iterable[str], started_at: datetime, duration: float) -> dict[str, Any]:
    """The JSON summary of a run that failed before any stage started (a missing input, an engine not
    installed): every selected stage is listed as not run."""
    listed = [{"name": name, "backend": pipeline.stages[name].backend, "status": "not run", "duration": None,
               "error": None, "reason": "the run failed before its stages started", "log_path": None}
              for name in stages]
    return _summary(pipeline, run_id=run_id, status="failed", trigger=trigger,
                    started_at=started_at.isoformat(timespec="seconds"), duration=duration, error=error,
                    stages=listed, resume_command=None, report=None)


def _summary(pipeline: Pipeline, *, run_id, status, trigger, started_at, duration, error, stages,  # noqa: PLR0913 - keyword-only: the summary's fields
             resume_command, report, checks=()) -> dict[str, Any]:
    summary = {
        "pipeline": pipeline.name, "pipeline_file": str(pipeline.file), "run_id": run_id, "status": status,
        "exit_code": int(error.exit_code) if error is not None else 0, "trigger": trigger,
        "started_at": started_at, "duration": round(duration, 3), "host": socket.gethostname(),
        "error": error.one_line() if error is not None else None,
        "failed_stages": [{k: s[k] for k in ("name", "error", "log_path")} for s in stages if s["status"] == "failed"],
        "stages": stages, "resume_command": resume_command, "report": report, **_calendar(pipeline),
        "checks": list(checks),  # data checks that failed, warned or dropped rows
    }
    return _redacted(summary, pipeline.redact)


def _calendar(pipeline: Pipeline) -> dict[str, Any]:
    """The time the run is for, and whether it caught up ticks the schedule missed (ops/calendar.py)."""
    notes = pipeline.calendar
    return {"scheduled_for": pipeline.run_moment().isoformat(timespec="seconds"),
            "caught_up": bool(notes.get("late") or notes.get("missed") and notes.get("catchup") != "none"),
            "missed_ticks": list(notes.get("missed") or [])}


def held_summary(pipeline: Pipeline, record: dict[str, Any]) -> dict[str, Any]:
    """The JSON summary of a tick a failed scheduled run holds (ops/calendar.py): status held, nothing ran."""
    summary = _summary(pipeline, run_id=record["run_id"], status="held", trigger="cron",
                       started_at=record["started_at"], duration=0.0, error=None, stages=[],
                       resume_command=f"hybridflow run {pipeline.shown_file} --resume", report=None)
    summary.update(error=pipeline.redact(record["error"]), scheduled_for=record["scheduled_for"], caught_up=False)
    return summary


def _redacted(value: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redacted(v, redact) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v, redact) for v in value]
    return value


def deliver(pipeline: Pipeline, summary: dict[str, Any]) -> list[Delivery]:
    """Send the summary on every channel `notify:` names, if it asks to hear about this status.
    Never raises: whatever goes wrong is an unsuccessful Delivery."""
    spec = pipeline.spec.notify
    if not wanted(spec, summary["status"]):
        return []
    body = json.dumps(summary, indent=1).encode()
    timeout = spec.timeout or NOTIFY_TIMEOUT
    scrub = _scrubber(pipeline, spec.url)
    deliveries = []
    if spec.url:
        deliveries.append(_safely("url", scrub, lambda: post(spec.url, body, timeout)))
    if spec.command:
        env = {"HYBRIDFLOW_RUN_ID": summary["run_id"] or "", "HYBRIDFLOW_STATUS": summary["status"],
               "HYBRIDFLOW_PIPELINE": summary["pipeline"]}
        if summary.get("report"):  # for a command that attaches it (mail -A "$HYBRIDFLOW_REPORT") or uploads it
            env["HYBRIDFLOW_REPORT"] = summary["report"]
        deliveries.append(_safely("command", scrub,
                                   lambda: run_command(spec.argv, body, env, timeout, str(pipeline.root))))
    return deliveries


def _safely(channel: str, scrub: Callable[[str], str], send: Callable[[], tuple[bool, str]]) -> Delivery:
    try:
        ok, detail = send()
    except Exception as exc:  # a notifier must never turn a finished run into a crash
        ok, detail = False, f"{type(exc).__name__}: {first_line(exc)}"
    return Delivery(channel, ok, scrub(detail))


def _scrubber(pipeline: Pipeline, url: str | None) -> Callable[[str], str]:
    """Redact ${env:...} values, and name the URL (even one with no secret in it) by its origin only."""
    def scrub(text: str) -> str:
        if url:
            text = text.replace(url, origin(url))
        return pipeline.redact(text)

    return scrub


def origin(url: str) -> str:
    """scheme://host[:port]: never the user, password, path or query, which may hold a token."""
    parts = urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{parts.hostname or '?'}{port}"


def post(url: str, body: bytes, timeout: float) -> tuple[bool, str]:
    """POST the JSON; retry connection errors and 5xx a couple of times, never a 4xx (it will not change)."""
    where = origin(url)
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": f"hybridflow/{__version__}"})
    attempts = len(RETRY_DELAYS) + 1
    for attempt in range(attempts):
        if attempt:
            time.sleep(RETRY_DELAYS[attempt - 1])
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return True, f"POST {where}: HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            problem = f"HTTP {exc.code} {exc.reason}"
            if exc.code < 500:
                return False, f"POST {where} failed: {problem}"
        except urllib.error.URLError as exc:  # refused, unknown host
            problem = str(exc.reason)
        except (OSError, http.client.HTTPException) as exc:  # timed out, connection dropped mid-reply
            problem = f"{type(exc).__name__}: {first_line(exc)}"
    return False, f"POST {where} failed after {attempts} attempts: {problem}"


def run_command(argv: list[str], body: bytes, env: dict[str, str], timeout: float, cwd: str) -> tuple[bool, str]:
    """Run the command without a shell, the summary on its stdin. It gets its own process group, so
    a timeout kills what it started too, and a Ctrl-C meant for hybridflow does not reach it."""
    name = os.path.basename(argv[0])
    try:
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   cwd=cwd, env={**os.environ, **env}, start_new_session=True)
    except FileNotFoundError:
        return False, f"command not found: {argv[0]}"
    except PermissionError:
        return False, f"cannot execute {argv[0]}: permission denied"
    try:
        _, stderr = process.communicate(body, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return False, f"{name} ran past its {timeout:g}s timeout and was killed"
    if process.returncode != 0:
        last = (stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
        return False, f"{name} exited with {process.returncode}" + (f": {last}" if last else "")
    return True, f"{name} exited with 0"
