"""The user's crontab: read with `crontab -l`, written whole with `crontab -`, hybridflow's entries marked.

A hybridflow entry is two lines: a marker comment carrying its identity as JSON, then the job line.
Every other line goes back byte for byte, so a user's own jobs and variables are never touched.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import asdict, dataclass

from ..errors import UnavailableError

MARKER = "# hybridflow-schedule "
JOB_SIGN = "--trigger cron"  # every job line hybridflow writes holds it; guards against deleting a user's line
REBOOT = "@reboot "  # the line after a job line that catches up at boot (ops/calendar.py)
_ENCODING = dict(encoding="utf-8", errors="surrogateescape")  # odd bytes in other lines survive a rewrite


@dataclass(frozen=True)
class Entry:
    pipeline: str
    file: str  # absolute: the identity of a schedule (two projects may reuse a pipeline name)
    cron: str  # as written in the pipeline, in `timezone`
    timezone: str
    log: str
    line: str = ""  # the job line as installed, in the system's time
    reboot: str = ""  # its @reboot line: `run --if-due` catches up the ticks missed while the machine was off

    def marker(self) -> str:
        identity = {k: v for k, v in asdict(self).items() if k not in ("line", "reboot")}
        return MARKER + json.dumps(identity)  # ensure_ascii: always one line, whatever the path holds


def read() -> str:
    """The current crontab's text; a user without one has an empty crontab."""
    done = _crontab(["-l"])
    if done.returncode == 0:
        return done.stdout.decode(**_ENCODING)
    message = _first_line(done.stderr)
    if message.startswith("no crontab for"):
        return ""
    raise UnavailableError(f"crontab -l failed: {message}", hint="check that cron is installed and you may use it")


def write(text: str) -> None:
    done = _crontab(["-"], text.encode(**_ENCODING))
    if done.returncode != 0:
        raise UnavailableError(f"crontab refused the new table: {_first_line(done.stderr)}",
                               hint="crontab -l shows the table as it is")


def _crontab(args: list[str], data: bytes | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["crontab", *args], input=data, capture_output=True, timeout=60)
    except FileNotFoundError:
        raise UnavailableError("the crontab command is not installed", hint="apt-get install cron") from None


def _first_line(stderr: bytes) -> str:
    return (stderr.decode(errors="replace").strip().splitlines() or ["no message"])[0]


_ASSIGNMENT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=")  # cron's `NAME=value`; a job line starts with a time


def assigned_names(text: str, entry: Entry | None = None) -> set[str]:
    """The variables the crontab's own `NAME=value` lines give `entry`'s job (those above its line),
    or a job appended at the end (every one) when `entry` is None or not in `text`. Names only."""
    return set(assigned_values(text, entry))


def assigned_values(text: str, entry: Entry | None = None) -> dict[str, str]:
    """The same, with their values (the last assignment of a name is the one cron gives)."""
    lines = text.split("\n")
    ends = [end for _, end, found in _blocks(lines) if entry is not None and found.file == entry.file]
    above = lines[:ends[0]] if ends else lines
    return {match.group(1): line[match.end():].strip().strip("'\"") for line in above
            if (match := _ASSIGNMENT.match(line))}


def entries(text: str) -> list[Entry]:
    return [entry for _, _, entry in _blocks(text.split("\n"))]


def put(text: str, entry: Entry) -> str:
    """`text` with `entry` in place of the entry for the same file, or appended at the end."""
    lines = text.split("\n")
    for start, end, old in _blocks(lines):
        if old.file == entry.file:
            lines[start:end] = _lines_of(entry)
            return "\n".join(lines)
    if text and not text.endswith("\n"):
        text += "\n"  # crontab needs every line ended; the only change ever made to another line
    return text + "".join(f"{line}\n" for line in _lines_of(entry))


def _lines_of(entry: Entry) -> list[str]:
    return [entry.marker(), entry.line, *([entry.reboot] if entry.reboot else [])]


def drop(text: str, doomed: Entry) -> str:
    """`text` without the entry for `doomed.file`."""
    lines = text.split("\n")
    for start, end, entry in _blocks(lines):
        if entry.file == doomed.file:
            del lines[start:end]
            break
    return "\n".join(lines)


def _blocks(lines: list[str]) -> list[tuple[int, int, Entry]]:
    """(first line, end line, entry) of every well-formed marker and the job line after it."""
    found = []
    for index, line in enumerate(lines):
        entry = _parse_marker(line)
        if entry is None:
            continue
        job = lines[index + 1] if index + 1 < len(lines) else ""
        if JOB_SIGN in job and not job.startswith(MARKER):
            after = lines[index + 2] if index + 2 < len(lines) else ""
            reboot = after if after.startswith(REBOOT) and JOB_SIGN in after else ""
            found.append((index, index + 2 + bool(reboot), Entry(**{**asdict(entry), "line": job, "reboot": reboot})))
        else:  # the job line was deleted by hand: the marker alone is ours to remove
            found.append((index, index + 1, entry))
    return found


def _parse_marker(line: str) -> Entry | None:
    if not line.startswith(MARKER):
        return None
    try:
        data = json.loads(line[len(MARKER):])
        return Entry(**{k: str(data[k]) for k in ("pipeline", "file", "cron", "timezone", "log")})
    except (ValueError, KeyError, TypeError):
        return None  # not ours to interpret: left exactly as it is
