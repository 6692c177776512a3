"""The pieces of the calendar that need no run: ticks in a zone, --for, --partitions."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from hybridflow.definition.runvalues import parse_moment, substitute, values
from hybridflow.errors import UsageError
from hybridflow.ops.backfill import Partitions
from hybridflow.ops.calendar import latest_tick, ticks_between

PARIS = ZoneInfo("Europe/Paris")


def test_ticks_are_in_the_schedules_zone_across_a_dst_change():
    # 25 October 2026: Paris goes from +02:00 to +01:00; a 03:00 tick stays 03:00 on the wall clock
    ticks = ticks_between("0 3 * * *", "Europe/Paris", datetime(2026, 10, 23, 12, tzinfo=timezone.utc),
                          datetime(2026, 10, 27, 12, tzinfo=timezone.utc))
    assert [t.isoformat() for t in ticks] == ["2026-10-24T03:00:00+02:00", "2026-10-25T03:00:00+01:00",
                                              "2026-10-26T03:00:00+01:00", "2026-10-27T03:00:00+01:00"]
    at = datetime(2026, 11, 22, 2, 0, 40, tzinfo=timezone.utc)  # 03:00:40 in Paris, a tick's minute
    assert latest_tick("0 3 * * 0", "Europe/Paris", at).isoformat() == "2026-11-22T03:00:00+01:00"
    assert latest_tick("0 3 * * 0", "Europe/Paris", at.replace(hour=1)).isoformat() == "2026-11-15T03:00:00+01:00"


def test_for_reads_a_time_in_the_schedules_zone_and_says_how_to_write_one():
    assert parse_moment("2026-11-22T03:00", "Europe/Paris") == datetime(2026, 11, 22, 3, tzinfo=PARIS)
    assert parse_moment("2026-11-22T02:00+00:00", "Europe/Paris").isoformat() == "2026-11-22T03:00:00+01:00"
    with pytest.raises(UsageError, match="--for 'next sunday' is not a date or time"):
        parse_moment("next sunday", "UTC")
    run = values(parse_moment("2026-11-22", "UTC"))
    assert substitute({"day": "in/${run.scheduled_date}.csv", "n": 3, "x": ["${run.scheduled_for}"]}, run) == \
        {"day": "in/2026-11-22.csv", "n": 3, "x": ["2026-11-22T00:00:00+00:00"]}


def test_partitions_are_a_range_or_a_list_of_one_column():
    weeks = Partitions.parse("week=2026-01-05..2026-03-30")
    assert weeks.holds("week=2026-01-05") and weeks.holds("region=eu/week=2026-03-30")
    assert not weeks.holds("week=2026-04-06") and not weeks.holds("day=2026-01-05")
    numbers = Partitions.parse("n=2..10")
    assert numbers.holds("n=9") and numbers.holds("n=10") and not numbers.holds("n=11")  # as numbers, not text
    assert Partitions.parse("region = eu, us").values == ("eu", "us")
    for wrong in ("2026-01-05..2026-03-30", "week=..2026-03-30", ""):
        with pytest.raises(UsageError):
            Partitions.parse(wrong)


def test_records_from_a_bucket_that_hold_no_time_or_no_object_are_passed_over():
    """A run record is data read from a bucket (or written by another version): a malformed one must
    not stop every scheduled invocation."""
    from hybridflow.ops.calendar import last_served
    from hybridflow.store.state import json_field

    runs = [{"trigger": "cron", "scheduled_for": 123}, {"trigger": "cron", "scheduled_for": "not a time"},
            {"trigger": "cron", "scheduled_for": "2026-11-22T03:00:00"},  # no offset: whose 03:00?
            {"trigger": "cron", "scheduled_for": "2026-11-15T03:00:00+01:00"}]
    assert last_served(runs, "Europe/Paris").isoformat() == "2026-11-15T03:00:00+01:00"
    assert json_field({"calendar": "[1, 2]"}, "calendar") == {} and json_field({"calendar": "{"}, "calendar") == {}
    assert json_field({"calendar": '{"resumed": true}'}, "calendar") == {"resumed": True}
