"""The calendar of a scheduled pipeline on a fake clock (HYBRIDFLOW_NOW): the time each run is for,
missed ticks caught up, a schedule held after a failed run. The real cron daemon: tests/cron."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

import hybridflow
from hybridflow.cli import app
from hybridflow.errors import ExitCode
from hybridflow.store.state import RunStore

cli = CliRunner()
SUNDAY = datetime.fromisoformat("2026-11-22T02:00:05+00:00")  # 03:00:05 in Paris, a tick of "0 3 * * 0"
WEEK = timedelta(days=7)

STAGES = '''
from pathlib import Path

import pandas as pd


def dated(day):
    if (Path(__file__).parent.parent / "FAIL").exists():
        raise RuntimeError("the delivery is broken")
    return pd.DataFrame({"day": [day]})


def stamped(ctx):
    return pd.DataFrame({"for": [ctx.scheduled_for.isoformat()]})


def delivered(delivery):
    return delivery


def plain():
    return pd.DataFrame({"x": [1]})
'''

PIPELINE = '''
name: weekly
stages:
  dated: {{run: "mypkg.steps:dated", outputs: [days], params: {{day: "${{run.scheduled_date}}"}}}}
  stamped: {{run: "mypkg.steps:stamped", outputs: [stamps]}}
  delivered: {{run: "mypkg.steps:delivered", inputs: [delivery], outputs: [copied]}}
  plain: {{run: "mypkg.steps:plain", outputs: [numbers]}}
datasets:
  delivery: {{path: "in/${{run.scheduled_date}}.csv", format: csv}}
schedule:
  cron: "0 3 * * 0"
  timezone: Europe/Paris
  catchup: {catchup}
  on_failure: {on_failure}
notify:
  on: [failure, success]
  command: ["sh", "-c", "cat > notified-$HYBRIDFLOW_RUN_ID.json"]
'''


@pytest.fixture
def weekly(project):
    def make(catchup: str = "latest", on_failure: str = "continue"):
        project.stages(STAGES)
        for week in range(8):
            day = (SUNDAY + week * WEEK).date().isoformat()
            project.write(f"in/{day}.csv", f"day,rows\n{day},{week}\n")
        return project.pipeline(PIPELINE.format(catchup=catchup, on_failure=on_failure))
    return make


def hf(monkeypatch, now: datetime | None, *args):
    if now is not None:
        monkeypatch.setenv("HYBRIDFLOW_NOW", now.isoformat())
    result = cli.invoke(app, [str(a) for a in args])
    return result


def records(project) -> list[dict]:
    return list(reversed(RunStore(project.root / ".hybridflow" / "runs.db").runs(limit=100)))  # oldest first


def statuses(project, run_id: str) -> dict[str, str]:
    return {s["stage"]: s["status"] for s in RunStore(project.root / ".hybridflow" / "runs.db").stages(run_id)}


def test_a_run_is_for_its_time_in_ctx_params_paths_records_and_fingerprints(project, weekly, monkeypatch):
    path = weekly()
    done = hf(monkeypatch, None, "run", path, "--for", "2026-11-22T03:00")
    assert done.exit_code == 0, done.output
    assert hybridflow.read(path, "days")["day"].tolist() == ["2026-11-22"]
    assert hybridflow.read(path, "stamps")["for"].tolist() == ["2026-11-22T03:00:00+01:00"]
    assert hybridflow.read(path, "copied")["rows"].tolist() == [0]  # in/2026-11-22.csv
    [first] = records(project)
    assert first["scheduled_for"] == "2026-11-22T03:00:00+01:00"

    done = hf(monkeypatch, None, "run", path, "--for", "2026-11-29T03:00")
    assert done.exit_code == 0, done.output
    second = records(project)[-1]
    # only the stages that use the date ran again
    assert statuses(project, second["run_id"]) == {"dated": "done", "stamped": "done", "delivered": "done",
                                                   "plain": "skipped"}
    assert hybridflow.read(path, "copied")["rows"].tolist() == [1]
    assert hf(monkeypatch, None, "run", path, "--for", "2026-11-29T03:00").exit_code == 0
    assert set(statuses(project, records(project)[-1]["run_id"]).values()) == {"skipped"}

    listed = hf(monkeypatch, None, "runs", path)
    assert "2026-11-29 03:00" in listed.output and "2026-11-22 03:00" in listed.output
    shown = hf(monkeypatch, None, "show", second["run_id"], "--pipeline", path)
    assert "for 2026-11-29T03:00:00+01:00" in shown.output


def test_a_manual_run_is_for_now_and_a_resumed_run_for_the_time_of_the_run_it_resumes(project, weekly,
                                                                                      monkeypatch):
    path = weekly()
    (project.root / "FAIL").touch()
    done = hf(monkeypatch, SUNDAY + timedelta(hours=5, seconds=30), "run", path)
    assert done.exit_code == ExitCode.STAGE_FAILED, done.output
    assert records(project)[-1]["scheduled_for"] == "2026-11-22T08:00:00+01:00"  # now, to the minute, in Paris
    (project.root / "FAIL").unlink()
    done = hf(monkeypatch, SUNDAY + 2 * WEEK, "resume", path)  # as run --resume
    assert done.exit_code == 0, done.output
    resumed = records(project)[-1]
    assert resumed["scheduled_for"] == "2026-11-22T08:00:00+01:00"
    assert "resumed run" in hf(monkeypatch, None, "show", resumed["run_id"], "--pipeline", path).output


@pytest.mark.parametrize("catchup, expected", [
    ("latest", [("2026-12-13T03:00:00+01:00", False, ["2026-11-29T03:00:00+01:00", "2026-12-06T03:00:00+01:00"])]),
    ("all", [("2026-11-29T03:00:00+01:00", True, ["2026-11-29T03:00:00+01:00"]),
             ("2026-12-06T03:00:00+01:00", True, ["2026-12-06T03:00:00+01:00"]),
             ("2026-12-13T03:00:00+01:00", False, [])]),
    ("none", [("2026-12-13T03:00:00+01:00", False, ["2026-11-29T03:00:00+01:00", "2026-12-06T03:00:00+01:00"])]),
])
def test_a_scheduled_invocation_catches_up_the_ticks_missed_since_the_last(project, weekly, monkeypatch, catchup,
                                                                            expected):
    path = weekly(catchup)
    assert hf(monkeypatch, SUNDAY, "run", "--trigger", "cron", path).exit_code == 0
    done = hf(monkeypatch, SUNDAY + 3 * WEEK, "run", "--trigger", "cron", path)  # two Sundays the machine was off
    assert done.exit_code == 0, done.output
    later = records(project)[1:]
    found = [(r["scheduled_for"], json.loads(r["calendar"])["late"], json.loads(r["calendar"])["missed"])
             for r in later]
    assert found == expected
    assert all(r["trigger"] == "cron" and r["status"] == "success" for r in later)
    summary = json.loads((project.root / f"notified-{later[0]['run_id']}.json").read_text())
    assert summary["scheduled_for"] == expected[0][0]
    assert summary["caught_up"] is (catchup != "none")
    # the same tick again (cron's line and @reboot in one minute): nothing more runs
    again = hf(monkeypatch, SUNDAY + 3 * WEEK, "run", "--trigger", "cron", path)
    assert again.exit_code == 0 and "nothing to run: a run has served the schedule's latest tick" in again.output
    assert len(records(project)) == 1 + len(expected)


def test_if_due_between_ticks_catches_up_the_newest_missed_tick_once(project, weekly, monkeypatch):
    path = weekly()
    assert hf(monkeypatch, SUNDAY, "run", "--trigger", "cron", path).exit_code == 0
    booted = SUNDAY + 2 * WEEK + timedelta(hours=30)  # Monday, after two Sundays off: @reboot's --if-due
    assert "tick(s) missed" in hf(monkeypatch, booted, "doctor", path).output
    assert hf(monkeypatch, booted, "run", "--if-due", "--trigger", "cron", path).exit_code == 0
    caught = records(project)[-1]
    assert caught["scheduled_for"] == "2026-12-06T03:00:00+01:00" and json.loads(caught["calendar"])["late"]
    assert "(late)" in hf(monkeypatch, None, "runs", path).output
    done = hf(monkeypatch, booted + timedelta(minutes=1), "run", "--if-due", "--trigger", "cron", path)
    assert (done.exit_code, len(records(project))) == (0, 2)


def test_a_failed_scheduled_run_holds_later_ticks_until_resumed_or_released(project, weekly, monkeypatch):
    path = weekly(on_failure="hold")
    (project.root / "FAIL").touch()
    assert hf(monkeypatch, SUNDAY, "run", "--trigger", "cron", path).exit_code == ExitCode.STAGE_FAILED
    failed = records(project)[-1]
    for week in (1, 2):
        done = hf(monkeypatch, SUNDAY + week * WEEK, "run", "--trigger", "cron", path)
        assert done.exit_code == 0, done.output
        held = records(project)[-1]
        assert held["status"] == "held" and held["error"].startswith(f"held: run {failed['run_id']} failed on ")
        assert statuses(project, held["run_id"]) == {}
        assert f"held: run {failed['run_id']}" in done.output
        assert json.loads((project.root / f"notified-{held['run_id']}.json").read_text())["status"] == "held"
    assert "held: run" in hf(monkeypatch, None, "doctor", path).output
    report = hf(monkeypatch, None, "report", held["run_id"], "--pipeline", path)
    assert report.exit_code == 0 and "held: run" in Path(report.output.strip()).read_text()
    (project.root / "FAIL").unlink()
    assert hf(monkeypatch, SUNDAY + 2 * WEEK + timedelta(hours=1), "run", path, "--resume").exit_code == 0
    assert records(project)[-1]["scheduled_for"] == "2026-11-22T03:00:00+01:00"  # the failed run's tick
    assert hf(monkeypatch, SUNDAY + 3 * WEEK, "run", "--trigger", "cron", path).exit_code == 0
    assert records(project)[-1]["status"] == "success"  # the hold is lifted

    (project.root / "FAIL").touch()
    assert hf(monkeypatch, SUNDAY + 4 * WEEK, "run", "--trigger", "cron", path).exit_code == ExitCode.STAGE_FAILED
    assert hf(monkeypatch, SUNDAY + 5 * WEEK, "run", "--trigger", "cron", path).exit_code == 0
    assert records(project)[-1]["status"] == "held"
    released = hf(monkeypatch, None, "schedule", "release", path)
    assert released.exit_code == 0 and "released" in released.output
    again = hf(monkeypatch, None, "schedule", "release", path)
    assert again.exit_code == ExitCode.USAGE and "is not held" in again.output
    (project.root / "FAIL").unlink()
    assert hf(monkeypatch, SUNDAY + 6 * WEEK, "run", "--trigger", "cron", path).exit_code == 0
    assert records(project)[-1]["status"] == "success"


def test_an_unknown_run_value_is_a_located_config_error(project, weekly, monkeypatch):
    path = weekly()
    path.write_text(path.read_text().replace("${run.scheduled_date}", "${run.schedule_date}", 1))
    done = hf(monkeypatch, None, "validate", path)
    assert done.exit_code == ExitCode.CONFIG
    assert "${run.schedule_date} is not a run value (did you mean 'scheduled_date'?)" in done.output


def test_schedule_list_shows_a_held_schedule(project, weekly, monkeypatch, saved_crontab):
    path = weekly(on_failure="hold")
    assert hf(monkeypatch, None, "schedule", "install", path).exit_code == 0
    listed = hf(monkeypatch, None, "schedule", "list")
    assert listed.exit_code == 0 and "held: run" not in listed.output
    (project.root / "FAIL").touch()
    assert hf(monkeypatch, SUNDAY, "run", "--trigger", "cron", path).exit_code == ExitCode.STAGE_FAILED
    listed = hf(monkeypatch, None, "schedule", "list")
    assert "held: run" in listed.output.replace("\n", " ").replace("│", " "), listed.output
