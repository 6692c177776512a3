"""The data checks of a run, per dataset, as `hybridflow show` prints them and the HTML report
shows them: each check's outcome and what it measured, beside what the previous run measured (a row
count that fell by half is seen at a glance)."""

from __future__ import annotations

import json
from html import escape
from typing import Any

COLUMNS = ("dataset", "check", "status", "failing rows", "measured", "previous run", "detail")
STYLES = {"passed": "green", "warned": "yellow", "dropped": "yellow", "failed": "red"}


def check_rows(stages: list[dict[str, Any]], previous: list[dict[str, Any]] | None = None) -> list[tuple]:
    """(dataset, check, status, failing, measured, previous measured, detail) of every recorded check."""
    before = {(dataset, o["check"]): o for dataset, o in _outcomes(previous or [])}
    return [(dataset, o["check"], o["status"], o.get("failing"), _measured(o.get("value")),
             _measured((before.get((dataset, o["check"])) or {}).get("value")), o.get("detail") or "")
            for dataset, o in _outcomes(stages)]


def _outcomes(stages: list[dict[str, Any]]):
    for stage in stages:
        for dataset, outcomes in json.loads(stage.get("checks") or "{}").items():
            for outcome in outcomes:  # a partitioned output's checks are shown per partition
                yield dataset + (f" {outcome['partition']}" if outcome.get("partition") else ""), outcome


def _measured(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):  # a row count change
        return f"{value['rows']:,} ({value['ratio']:.2f}x)"
    if isinstance(value, float):
        return f"{value:.2%}" if value <= 1 else f"{value:,.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def rich_table(stages: list[dict[str, Any]]):
    """The run's checks as a rich Table, or None when no check ran."""
    from rich.table import Table
    from rich.text import Text

    rows = check_rows(stages)
    if not rows:
        return None
    table = Table(title="data checks", title_justify="left")
    for column in COLUMNS[:5] + COLUMNS[6:]:
        table.add_column(column, justify="right" if column in ("failing rows", "measured") else "left",
                         overflow="fold")
    for dataset, check, status, failing, measured, _, detail in rows:
        table.add_row(dataset, check, Text(status, style=STYLES.get(status, "")),
                      "" if failing is None else f"{failing:,}", measured, detail)
    return table


def html_table(stages: list[dict[str, Any]], previous: list[dict[str, Any]] | None = None) -> str:
    """The run's checks as an HTML section (nothing when no check ran)."""
    rows = check_rows(stages, previous)
    if not rows:
        return ""
    body = "".join(
        f"<tr><td>{escape(d)}</td><td>{escape(c)}</td><td class='{escape(s)}'>{escape(s)}</td>"
        f"<td class='num'>{'' if f is None else f'{f:,}'}</td><td class='num'>{escape(m)}</td>"
        f"<td class='num'>{escape(p)}</td><td>{escape(detail)}</td></tr>"
        for d, c, s, f, m, p, detail in rows)
    head = "".join(f"<th>{h}</th>" for h in COLUMNS)
    return f"<h2>Data checks</h2><div class='scroll'><table><tr>{head}</tr>{body}</table></div>"
