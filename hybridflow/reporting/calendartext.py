"""A run's calendar in words: the time it is for, the ticks its schedule missed and what caught them up
(the `scheduled_for` and `calendar` of its record, written by ops/calendar.py)."""

from __future__ import annotations

from typing import Any

from ..store.state import json_field


def for_cell(run: dict[str, Any]) -> str:
    """'2026-11-22 03:00', with '(late)' for a run that caught up a tick that had passed."""
    moment = (run.get("scheduled_for") or "")[:16].replace("T", " ")
    notes = _notes(run)
    return f"{moment} (late)" if moment and notes.get("late") else moment


def lines(run: dict[str, Any]) -> list[str]:
    """What the run's record says of its calendar, one fact a line."""
    notes = _notes(run)
    found = []
    if run.get("scheduled_for"):
        found.append(f"for {run['scheduled_for']}" + (" (a missed tick, caught up late)" if notes.get("late") else ""))
    missed = notes.get("missed") or []
    if missed:
        shown = ", ".join(t[:16].replace("T", " ") for t in missed[-5:])
        more = f" (and {len(missed) - 5} more)" if len(missed) > 5 else ""
        if notes.get("held"):
            what = "held, not run"
        elif notes.get("catchup") == "none":
            what = "not run (catchup: none)"
        else:
            what = "caught up by this run"
        found.append(f"missed ticks: {shown}{more}: {what}")
    if notes.get("released"):
        found.append(f"released the schedule held after run {notes['released']}")
    if notes.get("backfill"):
        values = notes.get("values") or []
        found.append(f"backfill {notes['backfill']} of {notes.get('partitions')}: chunk {notes.get('chunk')} of "
                     f"{notes.get('chunks')} ({', '.join(values[:3])}{', ...' if len(values) > 3 else ''})")
    if notes.get("resumed"):
        found.append(f"resumed run {notes['resumed']}")
    return found


def backfill_chunks(runs: list[dict[str, Any]], run: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of the backfill `run` belongs to, in order, each with its last run: {"chunk", "values",
    "run_id", "status"} (run_id None for a chunk not started); [] for a run of no backfill."""
    notes = _notes(run)
    if not notes.get("backfill"):
        return []
    last: dict[int, dict] = {}
    for other in runs:  # newest first: a chunk's last attempt first
        found = _notes(other)
        if found.get("backfill") == notes["backfill"]:
            last.setdefault(found.get("chunk"), other)
    return [{"chunk": number, "values": values, "run_id": last.get(number, {}).get("run_id"),
             "status": last.get(number, {}).get("status", "not started")}
            for number, values in enumerate(notes.get("plan") or [], start=1)]


def _notes(run: dict[str, Any]) -> dict[str, Any]:
    return json_field(run, "calendar")
