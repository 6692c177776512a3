"""The time a run is for, and the `${run.NAME}` values params and dataset paths may use.

A scheduled run is for the cron tick it serves; a manual run is for now (to the minute) unless
`--for` names a time. `${run.scheduled_for}` is that time in the schedule's zone (ISO 8601 with its
offset) and `${run.scheduled_date}` its date; they are filled in when a run reads its params, so a
stage whose params use them has them in its fingerprint, and no other stage does.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

from ..errors import UsageError

# A test seam, not a setting: an ISO time that "now" is in the scheduling code (tests on a fake clock)
NOW_VARIABLE = "HYBRIDFLOW_NOW"
NAMES = ("scheduled_for", "scheduled_date")
REFERENCE = re.compile(r"\$\{run\.([A-Za-z_][A-Za-z0-9_]*)\}")


def clock() -> datetime:
    """Now, in UTC: HYBRIDFLOW_NOW when a test set it, else the system clock."""
    faked = os.environ.get(NOW_VARIABLE)
    if faked:
        moment = datetime.fromisoformat(faked)
        return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
    return datetime.now(timezone.utc)


def this_minute(zone: str) -> datetime:
    """Now in `zone`, to the minute: what a manual run is for."""
    return clock().astimezone(ZoneInfo(zone)).replace(second=0, microsecond=0)


def parse_moment(text: str, zone: str) -> datetime:
    """`--for 2026-11-22T03:00` (or a date, or a time with its offset); a time without an offset is in `zone`."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--for '{text}' is not a date or time",
                         hint="write it as 2026-11-22T03:00 (in the schedule's time zone) or 2026-11-22") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=ZoneInfo(zone))
    return moment.astimezone(ZoneInfo(zone))


def values(moment: datetime) -> dict[str, str]:
    return {"scheduled_for": moment.isoformat(timespec="seconds"), "scheduled_date": moment.date().isoformat()}


def substitute(value: Any, run: dict[str, str]) -> Any:
    """`value` with every `${run.NAME}` in its strings replaced (unknown names are left as written:
    the pipeline's checks report them)."""
    if isinstance(value, str) and "${run." in value:
        return REFERENCE.sub(lambda match: run.get(match.group(1), match.group(0)), value)
    if isinstance(value, dict):
        return {k: substitute(v, run) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, run) for v in value]
    return value


def unknown_references(value: Any) -> list[str]:
    """The `${run.NAME}` names in `value` that are not run values."""
    if isinstance(value, str):
        return [name for name in REFERENCE.findall(value) if name not in NAMES]
    if isinstance(value, dict):
        return [name for v in value.values() for name in unknown_references(v)]
    if isinstance(value, list):
        return [name for v in value for name in unknown_references(v)]
    return []
