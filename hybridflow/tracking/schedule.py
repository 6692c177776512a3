"""The time a run was scheduled for: for a run cron started, the pipeline's schedule's latest time
at or before the run's start (what OpenLineage calls the nominal time, MLflow a tag)."""

from __future__ import annotations

import zoneinfo
from datetime import datetime, timezone


def scheduled_for(pipeline, trigger: str, started: datetime) -> datetime | None:
    schedule = pipeline.spec.schedule
    if trigger != "cron" or schedule is None:
        return None
    from croniter import croniter

    local = started.astimezone(zoneinfo.ZoneInfo(schedule.timezone))
    return croniter(schedule.cron, local).get_prev(datetime).astimezone(timezone.utc)
