"""The calendar of a scheduled pipeline: which cron ticks a scheduled invocation runs for, which were
missed, and whether a failed scheduled run holds the schedule.

There is no daemon: every scheduled invocation (the cron line, `run --if-due` from @reboot) reads
the run records in the workdir (local or object storage). A tick is served once a scheduled run
(trigger cron) was recorded for it, whatever its outcome, or a held tick was. The ticks after the
newest served one, up to now, were missed: `catchup: latest` runs once for the newest tick, `all`
runs each in order, `none` runs only a tick that is due now. Missed ticks are written into the
record of the run that found them, so `runs`, `show` and the report list them.

With `on_failure: hold`, once a scheduled run failed, each later tick records a "held" run and
notifies instead of running, until a later run succeeds (a resume, or a whole run) or `schedule
release` records a release.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from ..definition.pipeline import Pipeline
from ..definition.runvalues import clock
from ..errors import UsageError
from ..results import new_run_id, now
from ..store.state import CALENDAR_STATUSES, RunStore, json_field
from ..store.workspace import Workspace

HELD, RELEASED = CALENDAR_STATUSES
FAILED = ("failed", "killed", "interrupted")
MAX_TICKS = 1000  # a schedule each minute and a machine off for weeks: the newest ones are kept
HISTORY = 200  # the newest run records read to find the last served tick and a hold


@dataclass
class Invocation:
    """What one scheduled invocation does: run for `ticks` in order (each with its calendar notes),
    or record `held` for `held_tick`; `missed` lists the ticks no run served."""

    ticks: list[datetime] = field(default_factory=list)
    notes: list[dict] = field(default_factory=list)
    missed: list[datetime] = field(default_factory=list)
    held: str | None = None
    held_tick: datetime | None = None


def ticks_between(cron: str, zone: str, after: datetime, upto: datetime) -> list[datetime]:
    """The ticks of `cron` in `zone` after `after` and not after `upto` (the newest MAX_TICKS)."""
    from croniter import croniter

    times = croniter(cron, after.astimezone(ZoneInfo(zone)))
    found: list[datetime] = []
    while (tick := times.get_next(datetime)) <= upto:
        found.append(tick)
        if len(found) > MAX_TICKS:
            found.pop(0)
    return found


def latest_tick(cron: str, zone: str, at: datetime) -> datetime:
    """The newest tick of `cron` at or before `at`'s minute."""
    from croniter import croniter

    minute = at.astimezone(ZoneInfo(zone)).replace(second=0, microsecond=0)
    return croniter(cron, minute + timedelta(minutes=1)).get_prev(datetime)


def history(pipeline: Pipeline) -> list[dict]:
    """The pipeline's newest run records, newest first (read from object storage as needed)."""
    store = Workspace.of(pipeline).recorded_runs(newest=HISTORY)
    return store.runs(pipeline.name, limit=HISTORY) if store is not None else []


def last_served(runs: list[dict], zone: str) -> datetime | None:
    """The newest tick a scheduled run (or a held tick) was recorded for."""
    ticks = [_moment(r["scheduled_for"], zone) for r in runs if r["trigger"] == "cron" and r.get("scheduled_for")]
    return max((tick for tick in ticks if tick is not None), default=None)


def missed_ticks(pipeline: Pipeline, runs: list[dict], now: datetime) -> list[datetime]:
    """The ticks since the last served one, up to now, that no scheduled run served. None before
    the first scheduled run: a new schedule owes nothing."""
    spec = pipeline.spec.schedule
    served = last_served(runs, spec.timezone)
    return [] if served is None else ticks_between(spec.cron, spec.timezone, served, now)


def hold_of(pipeline: Pipeline, runs: list[dict]) -> tuple[str, str] | None:
    """(why the schedule is held, the failed run's id), or None: the newest scheduled run that
    failed, when no later run succeeded (a resume or a run of every stage) and no release followed."""
    if pipeline.spec.schedule is None or pipeline.spec.schedule.on_failure != "hold":
        return None
    for run in runs:  # newest first
        status = run["status"]
        if status == RELEASED or status == "success" and (run["trigger"] == "cron" or _whole_or_resumed(run)):
            return None
        if run["trigger"] == "cron" and status in FAILED:
            day = run["started_at"][:16].replace("T", " ")
            return f"held: run {run['run_id']} failed on {day}", run["run_id"]
    return None


def plan(pipeline: Pipeline, if_due: bool, now: datetime | None = None) -> Invocation:
    """What a scheduled invocation at `now` does. if_due: called on a minute that may not be a tick
    (an every-minute line in another zone, @reboot): only a tick of this very minute is due."""
    spec = pipeline.spec.schedule
    if spec is None:
        raise UsageError(f"{pipeline.file} has no schedule", hint="add schedule: {cron: '0 3 * * 0'} to it")
    now = now or clock()
    runs = history(pipeline)
    current = latest_tick(spec.cron, spec.timezone, now)
    this_minute = now.astimezone(ZoneInfo(spec.timezone)).replace(second=0, microsecond=0)
    served = last_served(runs, spec.timezone)
    due = current if (current == this_minute or not if_due) and (served is None or current > served) else None
    missed = [t for t in missed_ticks(pipeline, runs, now) if t != due]
    invocation = Invocation(missed=missed)
    ticks = _chosen(spec.catchup, due, missed)
    held = hold_of(pipeline, runs) if ticks else None
    if held is not None:
        invocation.held, invocation.held_tick = held[0], ticks[-1]
        return invocation
    for tick in ticks:  # latest and none: the one run lists every missed tick; all: each late run its own
        late = tick != due
        listed = ([tick] if late else []) if spec.catchup == "all" else missed
        invocation.ticks.append(tick)
        invocation.notes.append({"catchup": spec.catchup, "late": late, "missed": [_iso(t) for t in listed]})
    return invocation


def _chosen(catchup: str, due: datetime | None, missed: list[datetime]) -> list[datetime]:
    if catchup == "all":
        return [*missed, *([due] if due else [])]
    if catchup == "latest":
        return [due] if due else missed[-1:]
    return [due] if due else []


def record_held(pipeline: Pipeline, invocation: Invocation) -> dict:
    """A held tick as a run record (status held, no stage), pushed to object storage like any run's."""
    workspace = Workspace.of(pipeline)
    store = workspace.run_store()
    stamp, run_id = now(), new_run_id()
    record = {"run_id": run_id, "pipeline": pipeline.name, "pipeline_file": str(pipeline.file),
              "trigger": "cron", "started_at": stamp, "ended_at": stamp, "status": HELD, "error": invocation.held,
              "run_dir": _run_dir(pipeline, run_id), "arguments": "{}", "scheduled_for": _iso(invocation.held_tick),
              "calendar": json.dumps({"held": True, "missed": [_iso(t) for t in invocation.missed]})}
    _save(workspace, store, record)
    return record


def release(pipeline: Pipeline) -> str:
    """Let the next tick of a held schedule run: a release recorded after the failed run. Returns
    the failed run's id."""
    held = hold_of(pipeline, history(pipeline))
    if held is None:
        raise UsageError(f"the schedule of {pipeline.name} is not held",
                         hint="hybridflow runs shows its scheduled runs")
    stamp, run_id = now(), new_run_id()
    workspace = Workspace.of(pipeline)
    _save(workspace, workspace.run_store(), {
        "run_id": run_id, "pipeline": pipeline.name, "pipeline_file": str(pipeline.file),
        "trigger": "manual", "started_at": stamp, "ended_at": stamp, "status": RELEASED,
        "error": None, "run_dir": _run_dir(pipeline, run_id), "arguments": "{}", "scheduled_for": None,
        "calendar": json.dumps({"released": held[1]})})
    return held[1]


def state(pipeline: Pipeline, now: datetime | None = None) -> tuple[str | None, list[datetime]]:
    """(why the schedule is held or None, the ticks missed since its last scheduled run)."""
    runs = history(pipeline)
    held = hold_of(pipeline, runs)
    return (held[0] if held else None), missed_ticks(pipeline, runs, now or clock())


def _save(workspace: Workspace, store: RunStore, record: dict) -> None:
    store.save_run(**record)
    workspace.push(store, record["run_id"])  # a workdir in object storage holds every run's record


def _run_dir(pipeline: Pipeline, run_id: str) -> str:
    """Where a report of the record goes (`hybridflow report` makes it): as for any run."""
    return str(pipeline.workdir / pipeline.name / "runs" / run_id)


def _whole_or_resumed(run: dict) -> bool:
    arguments = json_field(run, "arguments")
    return bool(json_field(run, "calendar").get("resumed")) or not any(arguments.get(k) for k in ("only", "from", "to"))


def _moment(text: Any, zone: str) -> datetime | None:
    """A recorded time, None for one that is not (a record from a bucket is data, never trusted)."""
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return moment.astimezone(ZoneInfo(zone)) if moment.tzinfo is not None else None


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


def findings(pipeline: Pipeline, now: datetime | None = None) -> list[tuple[str, str, str]]:
    """(status, detail, fix) of a scheduled pipeline's calendar, for `doctor`: a hold, missed ticks."""
    held, missed = state(pipeline, now)
    found = []
    if held:
        found.append(("warning", held, f"hybridflow run {pipeline.shown_file} --resume, or let the next tick run: "
                                       f"hybridflow schedule release {pipeline.shown_file}"))
    if missed:
        shown = ", ".join(_iso(t)[:16].replace("T", " ") for t in missed[-3:])
        catchup = pipeline.spec.schedule.catchup
        fix = ("the next scheduled invocation catches up (catchup: none: it will not)" if catchup == "none" else
               f"the next tick catches up (catchup: {catchup}); now: hybridflow run --if-due {pipeline.shown_file}")
        found.append(("warning", f"{len(missed)} tick(s) missed since the last scheduled run: {shown}", fix))
    return found or [("ok", "no tick missed, not held", "")]
