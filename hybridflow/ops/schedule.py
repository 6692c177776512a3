"""Pipelines on cron: the line to install, its time zone, and whether a scheduled run is due.

Cron runs jobs with a bare environment and no virtualenv, so the line carries everything a run
needs: absolute paths, the variables below, the working directory and a log file.

Debian's cron has no CRON_TZ. When the schedule's zone differs from the system's, the line fires
on every minute the schedule could fall on in system time, and `run --if-due` lets only the runs
due in the schedule's own zone through, which keeps DST changes and half-hour offsets right.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from datetime import datetime, timedelta, timezone, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo

from ..data import stores
from ..definition.pipeline import Pipeline
from ..errors import ConfigError, UsageError
from . import crontab
from .crontab import Entry

CRON_GIVES = ("HOME", "LOGNAME", "SHELL", "PATH")  # what cron itself sets for every job
# which store a run reaches, and how: carried into the cron line. Never the keys or a session token,
# which would sit in the crontab and in `ps`: cron's runs read them from AWS_PROFILE's files (or the
# key file GOOGLE_APPLICATION_CREDENTIALS names)
STORE_VARIABLES = stores.variables()
SYSTEM_ENVIRONMENT = Path("/etc/environment")  # read for cron jobs too, through pam_env
_CRON_ESCAPE = "\\%"  # cron turns a bare % into a newline
# one field as Debian's cron reads it: numbers, *, ranges, steps, lists, three-letter names
_VIXIE_FIELD = re.compile(r"(\*|\d+|[a-z]{3})(-(\d+|[a-z]{3}))?(/\d+)?"
                          r"(,(\*|\d+|[a-z]{3})(-(\d+|[a-z]{3}))?(/\d+)?)*", re.IGNORECASE)
_VIXIE_NICKNAMES = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}


def install(pipeline: Pipeline, environ: dict[str, str] | None = None) -> Entry:
    """Write the pipeline's schedule into the crontab, replacing its previous entry."""
    spec = _schedule_of(pipeline)
    zone = ZoneInfo(spec.timezone)
    shifts = offset_differences(zone, system_zone(), datetime.now(timezone.utc))
    same_time = shifts == {0} and _vixie_compatible(spec.cron)
    fields = spec.cron if same_time else system_fields(spec.cron, shifts)
    log = pipeline.workdir / pipeline.name / "cron.log"
    line = f"{fields} {job_command(pipeline, log, if_due=not same_time, environ=environ)}"
    # cron drops the ticks that fell while the machine was off: at boot, --if-due catches them up
    reboot = f"{crontab.REBOOT}{job_command(pipeline, log, if_due=True, environ=environ)}" \
        if spec.catchup != "none" else ""
    entry = Entry(pipeline.name, str(pipeline.file), spec.cron, spec.timezone, str(log), line, reboot)
    crontab.write(crontab.put(crontab.read(), entry))
    return entry


def remove(target: str) -> Entry:
    """Remove the entry of a pipeline, named by its file or by its name."""
    text = crontab.read()
    entry = find(crontab.entries(text), target)
    crontab.write(crontab.drop(text, entry))
    return entry


def installed() -> list[Entry]:
    return crontab.entries(crontab.read())


def installed_for(pipeline: Pipeline) -> Entry | None:
    return next((e for e in installed() if e.file == str(pipeline.file)), None)


def find(entries: list[Entry], target: str) -> Entry:
    """The one entry whose pipeline file or name is `target`."""
    path = Path(target)
    by_file = path.suffix in (".yaml", ".yml") or os.sep in target or path.is_file()
    key = str(path.resolve()) if by_file else target
    matches = [e for e in entries if (e.file if by_file else e.pipeline) == key]
    if not matches:
        raise UsageError(f"no hybridflow schedule is installed for {target}",
                         hint="hybridflow schedule list shows the installed ones")
    if len(matches) > 1:
        raise UsageError(f"{len(matches)} scheduled pipelines are named {target}", hint="name its file instead")
    return matches[0]


def next_runs(entry: Entry, count: int = 2, now: datetime | None = None) -> list[datetime]:
    from croniter import croniter

    start = (now or datetime.now(timezone.utc)).astimezone(ZoneInfo(entry.timezone))
    times = croniter(entry.cron, start)
    return [times.get_next(datetime) for _ in range(count)]


def is_due_now(pipeline: Pipeline) -> bool:
    spec = _schedule_of(pipeline)
    return is_due(spec.cron, spec.timezone)


def is_due(cron: str, zone: str, now: datetime | None = None) -> bool:
    """Whether `cron` fires in this minute of `zone`'s wall clock."""
    from croniter import croniter

    local = (now or datetime.now(timezone.utc)).astimezone(ZoneInfo(zone))
    hours = croniter.expand(cron)[0][1]
    # clocks going back repeat an hour: a job at a fixed hour runs in its first pass only, as in cron
    if local.fold and hours != ["*"]:
        return False
    return croniter.match(cron, local.replace(tzinfo=None, second=0, microsecond=0))


def system_zone() -> tzinfo:
    """The zone the cron daemon schedules in: /etc/localtime, whatever TZ this process has."""
    try:
        with open("/etc/localtime", "rb") as file:
            return ZoneInfo.from_file(file, key="localtime")
    except (OSError, ValueError):
        return timezone.utc  # glibc's default without /etc/localtime


def offset_differences(zone: tzinfo, system: tzinfo, start: datetime, days: int = 366) -> set[int]:
    """Every value, in minutes, of zone's UTC offset minus system's over the coming `days`.

    Sampled each quarter hour (offsets change on quarter hours), and minute by minute before a change.
    """
    def difference(seconds: int) -> int:
        instant = datetime.fromtimestamp(seconds, timezone.utc)
        return (instant.astimezone(zone).utcoffset() - instant.astimezone(system).utcoffset()) // timedelta(minutes=1)

    quarter = 15 * 60
    first = int(start.timestamp()) // quarter * quarter
    previous = difference(first)
    found = {previous}
    for seconds in range(first + quarter, first + days * 86400, quarter):
        current = difference(seconds)
        if current != previous:
            found.update(difference(s) for s in range(seconds - quarter + 60, seconds, 60))
        found.add(current)
        previous = current
    return found


def system_fields(cron: str, shifts: set[int]) -> str:
    """Cron fields, in system time, matching every minute `cron` can fire on when shifted by `shifts`.

    Days are `*`: a shift can move a run across midnight, and `--if-due` checks the day anyway.
    """
    from croniter import croniter

    minutes, hours = croniter.expand(cron)[0][:2]
    minutes = range(60) if minutes == ["*"] else minutes
    hours = range(24) if hours == ["*"] else hours
    times = {(hour * 60 + minute - shift) % 1440 for hour in hours for minute in minutes for shift in shifts}
    return f"{_field({t % 60 for t in times}, 60)} {_field({t // 60 for t in times}, 24)} * * *"


def _field(values: set[int], size: int) -> str:
    return "*" if len(values) == size else ",".join(map(str, sorted(values)))


def _vixie_compatible(cron: str) -> bool:
    """Whether Debian's cron reads `cron` as croniter does (no L, W, #, ? or seconds field)."""
    fields = cron.split()
    if len(fields) == 1:
        return fields[0].lower() in _VIXIE_NICKNAMES
    return len(fields) == 5 and all(_VIXIE_FIELD.fullmatch(f) for f in fields)


def job_command(pipeline: Pipeline, log: Path, *, if_due: bool, environ: dict[str, str] | None = None) -> str:
    """The shell command of the cron line: absolute paths, the run's environment inline, output to `log`."""
    python = os.path.abspath(sys.executable)  # not resolved: a venv's python is a symlink to the base one
    variables = " ".join(shlex.quote(f"{k}={v}") for k, v in run_environment(python, environ).items())
    run = [python, "-m", "hybridflow.cli", "run", "--trigger", "cron", *(["--if-due"] * if_due), str(pipeline.file)]
    env = shlex.quote(shutil.which("env") or "env")
    command = (f"cd {shlex.quote(str(pipeline.root))} && mkdir -p {shlex.quote(str(log.parent))} && "
               f"{env} {variables} {shlex.join(run)} >> {shlex.quote(str(log))} 2>&1")
    if "\n" in command or _CRON_ESCAPE in command:
        raise UsageError("a path or variable of this run holds a newline or '\\%', which a crontab line cannot carry",
                         hint="move the project, or unset the variable, then install again")
    return command.replace("%", _CRON_ESCAPE)


def carried_environment() -> tuple[str, ...]:
    """What a run under cron is given from the installing shell: PATH, the variables the engines say
    they read (backends.Engine.environment: Spark's JAVA_HOME), the locale, the time zone and HOME."""
    from ..engines import engines

    declared = [name for engine in engines().values() for name in engine.environment]
    return tuple(dict.fromkeys(["PATH", *declared, "LANG", "TZ", "HOME", *STORE_VARIABLES]))


def run_environment(python: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables a run needs that cron does not give it, taken from the installing shell."""
    environ = os.environ if environ is None else environ
    variables = {name: environ[name] for name in carried_environment() if environ.get(name)}
    # engines start `python3` from PATH (Spark's Python workers): this interpreter's directory comes first
    bindir = os.path.dirname(python)
    rest = [p for p in variables.get("PATH", os.defpath).split(os.pathsep) if p and p != bindir]
    variables["PATH"] = os.pathsep.join([bindir, *rest])
    variables.setdefault("LANG", "C.UTF-8")  # cron's POSIX locale would make engines read and write ASCII
    return variables


def cron_variables(pipeline: Pipeline, environ: dict[str, str] | None = None) -> tuple[set[str], Entry | None]:
    """The names of the variables a cron run of `pipeline` will have, and its installed entry: those
    of cron itself, /etc/environment, the crontab's `NAME=value` lines above the job line, and the
    job line's own (as installed; else as `install` would write it from `environ`). Never values."""
    text = crontab.read()
    entry = next((e for e in crontab.entries(text) if e.file == str(pipeline.file) and e.line), None)
    if entry is not None:
        on_line = line_variables(entry.line)
    else:  # a marker whose job line was deleted by hand installs nothing either
        on_line = set(run_environment(os.path.abspath(sys.executable), environ))
    return set(CRON_GIVES) | _system_names() | crontab.assigned_names(text, entry) | on_line, entry


def cron_store_values(pipeline: Pipeline, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The STORE_VARIABLES a cron run of `pipeline` will have, with their values (none is a secret):
    /etc/environment's, then the crontab's `NAME=value` lines above its job, then the job line's own
    (as installed; else as `install` would write it from `environ`)."""
    text = crontab.read()
    entry = next((e for e in crontab.entries(text) if e.file == str(pipeline.file) and e.line), None)
    values = {**_system_values(), **crontab.assigned_values(text, entry)}
    values.update(line_values(entry.line) if entry is not None
                  else run_environment(os.path.abspath(sys.executable), environ))
    return {name: value for name, value in values.items() if name in STORE_VARIABLES}


def line_variables(line: str) -> set[str]:
    """The names a job line sets with `env NAME=value ... command` (as `job_command` writes it)."""
    return set(line_values(line))


def line_values(line: str) -> dict[str, str]:
    try:
        words = shlex.split(line.replace(_CRON_ESCAPE, "%"))
    except ValueError:
        return {}
    starts = [i + 1 for i, word in enumerate(words) if os.path.basename(word) == "env" and i and words[i - 1] == "&&"]
    values = {}
    for word in words[starts[0]:] if starts else []:
        name, equals, value = word.partition("=")
        if not (equals and name.isidentifier()):
            break
        values[name] = value
    return values


def _system_names() -> set[str]:
    return set(_system_values())


def _system_values() -> dict[str, str]:
    try:
        lines = SYSTEM_ENVIRONMENT.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    pairs = (line.strip().removeprefix("export ").partition("=") for line in lines)
    return {name.strip(): value.strip().strip("'\"") for name, equals, value in pairs
            if equals and name.strip().isidentifier()}


def _schedule_of(pipeline: Pipeline):
    if pipeline.spec.schedule is None:
        raise ConfigError(f"{pipeline.file} has no schedule",
                          hint="add schedule: {cron: '0 3 * * 1', timezone: UTC} to the pipeline file")
    return pipeline.spec.schedule
