"""Stages of configs/quickstart.yaml: clean raw events, aggregate them per customer and week, report.

Written against plain pandas (Arrow-backed dtypes), as any stage on the python backend is.
"""

from __future__ import annotations

import json

import pandas as pd


def clean(events: pd.DataFrame, ctx) -> dict[str, pd.DataFrame]:
    """Drop duplicate deliveries and malformed rows; keep the rejects for inspection."""
    deduped = events.drop_duplicates(subset="event_id", keep="first")
    malformed = deduped["customer_id"].isna() | (deduped["amount"].fillna(0) < 0)
    ctx.log.info("%d duplicates, %d malformed rows", len(events) - len(deduped), int(malformed.sum()))
    good = deduped[~malformed].sort_values(["ts", "event_id"]).reset_index(drop=True)
    return {"clean_events": good, "rejected_events": deduped[malformed].reset_index(drop=True)}


def weekly_activity(clean_events: pd.DataFrame, min_events: int) -> pd.DataFrame:
    """One row per customer and ISO week, for customers with at least min_events events that week."""
    ts = clean_events["ts"]
    monday = ts.dt.floor("D") - pd.to_timedelta(ts.dt.day_of_week.astype("int64"), unit="D")
    events = clean_events.assign(
        week=monday.dt.date,
        purchases=(clean_events["event_type"] == "purchase").astype("int64[pyarrow]"),
        tickets=(clean_events["event_type"] == "support_ticket").astype("int64[pyarrow]"),
    )
    weekly = (events.groupby(["customer_id", "week"], as_index=False)
              .agg(events=("event_id", "count"), purchases=("purchases", "sum"),
                   tickets=("tickets", "sum"), revenue=("amount", "sum")))
    weekly["events"] = weekly["events"].astype("int64[pyarrow]")
    return weekly[weekly["events"] >= min_events].reset_index(drop=True)


def report(weekly: pd.DataFrame, rejected_events: pd.DataFrame, ctx) -> None:
    """Write a summary a person can open: JSON for machines, Markdown for people."""
    out = ctx.output_path("activity_report")
    per_week = weekly.groupby("week").agg(customers=("customer_id", "nunique"), revenue=("revenue", "sum"))
    summary = {
        "run_id": ctx.run_id,
        "customer_weeks": len(weekly),
        "rejected_rows": len(rejected_events),
        "weeks": {str(week): {"customers": int(row.customers), "revenue": str(row.revenue)}
                  for week, row in per_week.iterrows()},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    lines = ["| week | active customers | revenue |", "|---|---:|---:|"]
    lines += [f"| {week} | {v['customers']} | {v['revenue']} |" for week, v in summary["weeks"].items()]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
