"""`hybridflow schedule` and `run --if-due`: the crontab line, other lines left alone, time zones."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from typer.testing import CliRunner

from hybridflow.cli import app
from hybridflow.definition.config import load_pipeline
from hybridflow.errors import ExitCode
from hybridflow.ops import schedule
from hybridflow.store.state import RunStore
from tests.support.crontabs import TINY_STAGES, crontab_bytes, set_crontab, tiny_pipeline
from tests.support.projects import Project

cli = CliRunner()
UTC = timezone.utc
# a user's own crontab: variables, comments, blank lines, % in commands, non-ASCII
OTHER_LINES = ('MAILTO=""\nSHELL=/bin/bash\n# backups, 100% mine: café\n'
               '*/5 * * * * echo "a\\%b" > /dev/null\n\n@reboot /usr/bin/true\n').encode()


def invoke(*args):
    return cli.invoke(app, [str(a) for a in args])


def scheduled_project(project: Project, cron: str = "0 3 * * 1", zone: str = "UTC", name: str = "tiny"):
    project.stages(TINY_STAGES)
    return project.pipeline(tiny_pipeline(cron, zone, name), f"{name}.yaml")


def test_install_replace_remove_leave_other_lines_byte_for_byte(project, saved_crontab):
    set_crontab(OTHER_LINES)
    first = scheduled_project(project, name="first")
    second = scheduled_project(project, name="second")
    assert invoke("schedule", "install", first).exit_code == 0
    assert invoke("schedule", "install", second).exit_code == 0
    installed = crontab_bytes()
    assert installed.startswith(OTHER_LINES)
    assert installed.count(b"# hybridflow-schedule ") == 2

    project.pipeline(tiny_pipeline("15 4 * * *", "UTC", "first"), "first.yaml")
    result = invoke("schedule", "install", first)
    assert result.exit_code == 0, result.output
    entries = schedule.installed()
    assert [(e.pipeline, e.cron) for e in entries] == [("first", "15 4 * * *"), ("second", "0 3 * * 1")]
    assert crontab_bytes().startswith(OTHER_LINES)

    assert invoke("schedule", "remove", first).exit_code == 0
    result = invoke("schedule", "remove", "second")  # by name
    assert result.exit_code == 0, result.output
    assert "removed the schedule of second" in result.output
    assert crontab_bytes() == OTHER_LINES


def test_the_line_has_absolute_paths_its_environment_and_a_log(tmp_path, saved_crontab):
    project = Project(tmp_path / "my 100% project")
    path = scheduled_project(project, cron="0 3 * * 1", zone="UTC")
    environ = {"PATH": "/usr/bin:/bin", "JAVA_HOME": "/opt/my jdk", "LANG": "C.UTF-8", "TZ": "UTC",
               "HOME": "/root", "SECRET_TOKEN": "not carried"}
    entry = schedule.install(load_pipeline(path), environ=environ)
    [line] = [text for text in crontab_bytes().decode().splitlines() if "--trigger cron" in text
              and not text.startswith("@reboot")]
    assert line == entry.line
    assert re.search(r"(?<!\\)%", line) is None, "a bare % is a newline to cron"
    command = line.split(" ", 5)[5].replace("\\%", "%")  # what cron hands to /bin/sh
    python = os.path.abspath(sys.executable)
    workdir = project.root / ".hybridflow"
    assert command.startswith(f"cd '{project.root}' && mkdir -p '{workdir / 'tiny'}' && ")
    assert f" PATH={os.path.dirname(python)}:/usr/bin:/bin " in command  # this install's interpreter first
    for assignment in ("'JAVA_HOME=/opt/my jdk'", "LANG=C.UTF-8", "TZ=UTC", "HOME=/root"):
        assert assignment in command
    assert "SECRET_TOKEN" not in command
    assert f"{python} -m hybridflow.cli run --trigger cron '{path}' >> '{workdir / 'tiny' / 'cron.log'}' 2>&1" \
        in command
    assert entry.log == str(workdir / "tiny" / "cron.log")


def test_the_line_runs_in_crons_bare_environment(tmp_path, saved_crontab):
    project = Project(tmp_path / "a 50% dir")
    path = scheduled_project(project, cron="* * * * *", zone="Asia/Kathmandu")
    entry = schedule.install(load_pipeline(path))
    command = entry.line.split(" ", 5)[5].replace("\\%", "%")
    cron_environment = {"PATH": "/usr/bin:/bin", "SHELL": "/bin/sh", "HOME": "/root", "LOGNAME": "root"}
    done = subprocess.run(["/bin/sh", "-c", command], env=cron_environment, cwd="/", timeout=120)
    log = (project.root / ".hybridflow" / "tiny" / "cron.log").read_text()
    assert done.returncode == 0, log
    [run] = RunStore(project.root / ".hybridflow" / "runs.db").runs()
    assert (run["trigger"], run["status"]) == ("cron", "success"), log
    assert "tiny run" in log and "success" in log


def test_same_zone_installs_the_expression_as_is(project, saved_crontab):
    now = datetime.now(UTC)
    system_is_utc = schedule.offset_differences(ZoneInfo("UTC"), schedule.system_zone(), now) == {0}
    for name, zone in (("in_utc", "UTC"), ("in_kathmandu", "Asia/Kathmandu")):
        differs = schedule.offset_differences(ZoneInfo(zone), schedule.system_zone(), now) != {0}
        entry = schedule.install(load_pipeline(scheduled_project(project, "0 3 * * 1", zone, name)))
        fields = " ".join(entry.line.split(" ", 5)[:5])
        assert ("--if-due" in entry.line) == differs
        assert (fields == "0 3 * * 1") == (not differs)
    if system_is_utc:
        assert fields == "15 21 * * *"  # 03:00 in Kathmandu (+5:45) is 21:15 UTC the day before


@pytest.mark.parametrize("zone, system, cron, expected", [
    ("Europe/Paris", "UTC", "0 3 * * 1", "0 1,2 * * *"),
    ("Asia/Kathmandu", "UTC", "0 3 * * 1", "15 21 * * *"),
    ("America/St_Johns", "UTC", "0 3 * * 1", "30 5,6 * * *"),
    ("Australia/Lord_Howe", "Europe/London", "45 23 * * *", None),  # half-hour DST in one, DST in the other
    ("America/New_York", "Europe/Berlin", "*/20 9-17 * * 1-5", None),  # their DST changes on different days
    ("UTC", "Asia/Kolkata", "30 2 1 * *", "0 8 * * *"),
])
def test_system_fields_cover_every_run_in_the_coming_year(zone, system, cron, expected):
    start = datetime(2026, 1, 1, tzinfo=UTC)
    shifts = schedule.offset_differences(ZoneInfo(zone), ZoneInfo(system), start)
    fields = schedule.system_fields(cron, shifts)
    if expected:
        assert fields == expected
    assert fields != "* * * * *"
    runs = croniter(cron, start.astimezone(ZoneInfo(zone)))
    while (run := runs.get_next(datetime)) < start + timedelta(days=365):
        in_system = run.astimezone(ZoneInfo(system)).replace(tzinfo=None)
        assert croniter.match(fields, in_system), (run, in_system, fields)
        assert schedule.is_due(cron, zone, run)


def test_is_due_to_the_minute_and_across_daylight_saving():
    paris = "Europe/Paris"
    assert schedule.is_due("0 3 * * 1", paris, datetime(2026, 11, 23, 2, 0, 40, tzinfo=UTC))  # Monday 03:00 CET
    assert not schedule.is_due("0 3 * * 1", paris, datetime(2026, 11, 23, 2, 1, tzinfo=UTC))
    assert not schedule.is_due("0 3 * * 1", paris, datetime(2026, 11, 23, 3, 0, tzinfo=UTC))
    # 25 October 2026: 02:30 happens twice in Paris; a fixed-hour job runs once, an every-30-minutes job twice
    first, second = datetime(2026, 10, 25, 0, 30, tzinfo=UTC), datetime(2026, 10, 25, 1, 30, tzinfo=UTC)
    assert [schedule.is_due("30 2 * * *", paris, t) for t in (first, second)] == [True, False]
    assert [schedule.is_due("*/30 * * * *", paris, t) for t in (first, second)] == [True, True]
    # 29 March 2026: 02:30 does not exist in Paris, so that day has no 02:30 run
    day = datetime(2026, 3, 29, tzinfo=UTC)
    assert not any(schedule.is_due("30 2 * * *", paris, day + timedelta(minutes=m)) for m in range(1440))
    assert sum(schedule.is_due("30 2 * * *", paris, day + timedelta(days=1, minutes=m)) for m in range(1440)) == 1


def test_run_if_due_exits_quietly_unless_due(project):
    zone = "Asia/Kathmandu"
    later = (datetime.now(ZoneInfo(zone)).minute + 30) % 60
    path = scheduled_project(project, f"{later} * * * *", zone)
    result = invoke("run", "--if-due", "--trigger", "cron", path)
    assert (result.exit_code, result.output) == (0, "")
    assert not (project.root / ".hybridflow" / "runs.db").exists()

    project.pipeline(tiny_pipeline("* * * * *", zone), "tiny.yaml")
    result = invoke("run", "--if-due", "--trigger", "cron", path)
    assert result.exit_code == 0, result.output
    [run] = RunStore(project.root / ".hybridflow" / "runs.db").runs()
    assert (run["trigger"], run["status"]) == ("cron", "success")


def test_unscheduled_pipeline_is_a_config_error(project):
    project.stages(TINY_STAGES)
    path = project.pipeline("name: plain\nstages:\n  make: {run: 'mypkg.steps:make', outputs: [numbers]}\n")
    for args in (("schedule", "install", path), ("run", "--if-due", path)):
        result = invoke(*args)
        assert result.exit_code == ExitCode.CONFIG, result.output
        assert "has no schedule (add schedule: {cron:" in result.output
        assert len(result.output.strip().splitlines()) == 1


def test_removing_what_is_not_installed_is_an_error(project, saved_crontab):
    set_crontab(OTHER_LINES)
    for target in ("nothing-here", project.root / "missing.yaml"):
        result = invoke("schedule", "remove", target)
        assert result.exit_code == ExitCode.USAGE
        assert f"no hybridflow schedule is installed for {target}" in result.output
    assert crontab_bytes() == OTHER_LINES


def test_list_shows_schedules_with_their_next_runs(project, saved_crontab):
    set_crontab(None)
    result = invoke("schedule", "list")
    assert result.exit_code == 0 and "no hybridflow schedule is installed" in result.output
    path = scheduled_project(project, "0 3 * * 1", "Asia/Kolkata")
    assert invoke("schedule", "install", path).exit_code == 0
    now = datetime.now(ZoneInfo("Asia/Kolkata"))
    monday = (now + timedelta(days=-now.weekday() % 7)).replace(hour=3, minute=0, second=0, microsecond=0)
    monday += timedelta(days=7) * (monday <= now)
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "schedule", "list"], capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "300"}, timeout=120)
    assert done.returncode == 0, done.stderr
    [row] = [line for line in done.stdout.splitlines() if " tiny " in line]
    for text in (str(path), "0 3 * * 1", "Asia/Kolkata", f"{monday:%Y-%m-%d} 03:00 IST",
                 f"{monday + timedelta(days=7):%Y-%m-%d} 03:00 IST"):
        assert text in row


def test_the_cron_line_carries_the_stores_settings_and_never_its_secrets(project, fake_crontab):
    path = scheduled_project(project)
    shell = {"PATH": "/usr/bin:/bin", "AWS_ENDPOINT_URL": "http://store.internal:9000", "AWS_REGION": "eu-west-3",
             "AWS_PROFILE": "lake", "AWS_CONFIG_FILE": "/srv/aws/config", "AWS_ACCESS_KEY_ID": "AKIAHFTESTKEY",
             "AWS_SECRET_ACCESS_KEY": "hf-secret-0123456789", "AWS_SESSION_TOKEN": "hf-token-0123456789"}
    entry = schedule.install(load_pipeline(path, environ=shell), environ=shell)
    carried = schedule.line_values(entry.line)
    for name in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE"):
        assert carried[name] == shell[name], entry.line
    table = fake_crontab.read_text()
    assert not any(secret in table for secret in ("AKIAHFTESTKEY", "hf-secret-0123456789", "hf-token-0123456789"))
