"""Stages of configs/three_engines.yaml: one pipeline, four engines, each doing what it is best at.

python -> spark -> dask -> ray -> python. Each function is written against its engine's own API.
"""

from __future__ import annotations

import json

import pandas as pd


def load(events: pd.DataFrame) -> pd.DataFrame:
    """In-process: the raw CSV arrives typed by its declared schema; keep what the ETL needs."""
    return events[["event_id", "customer_id", "ts", "event_type", "amount"]]


def weekly_etl(raw_events, ctx):
    """Spark SQL: drop duplicate deliveries and malformed rows, aggregate per customer and week."""
    raw_events.createOrReplaceTempView("raw_events")
    return ctx.spark.sql("""
        WITH deduplicated AS (
            SELECT *, ROW_NUMBER() OVER (PARTITION BY event_id ORDER BY ts) AS copy
            FROM raw_events
        )
        SELECT customer_id,
               CAST(date_trunc('WEEK', ts) AS DATE) AS week,
               COUNT(*) AS events,
               SUM(CASE WHEN event_type = 'purchase' THEN 1 ELSE 0 END) AS purchases,
               SUM(CASE WHEN event_type = 'support_ticket' THEN 1 ELSE 0 END) AS tickets,
               SUM(amount) AS revenue
        FROM deduplicated
        WHERE copy = 1 AND customer_id IS NOT NULL AND COALESCE(amount, 0) >= 0
        GROUP BY customer_id, CAST(date_trunc('WEEK', ts) AS DATE)
    """)


def features(customer_weeks, window: int):
    """Dask, pandas-style: per-customer rolling activity over the last `window` weeks."""
    def per_partition(part: pd.DataFrame) -> pd.DataFrame:
        part = part.sort_values(["customer_id", "week"])
        by_customer = part.groupby("customer_id")
        rolling = by_customer["events"].transform(lambda s: s.rolling(window, min_periods=1).mean())
        return part.assign(events_rolling=rolling.astype("float64[pyarrow]"),
                           tickets_total=by_customer["tickets"].cumsum())

    meta = customer_weeks._meta.assign(events_rolling=pd.Series(dtype="float64[pyarrow]"),
                                       tickets_total=customer_weeks._meta["tickets"])
    # every customer's weeks in one partition, then plain pandas per partition
    return customer_weeks.shuffle("customer_id").map_partitions(per_partition, meta=meta)


def score(customer_features, ticket_weight: float):
    """Ray Data: score every customer-week in parallel batches."""
    def batch_score(batch: pd.DataFrame) -> pd.DataFrame:
        risk = ticket_weight * batch["tickets_total"].astype("float64") - batch["events_rolling"].astype("float64")
        return batch.assign(risk=risk.astype("float64"))

    return customer_features.map_batches(batch_score, batch_format="pandas")


def report(scores: pd.DataFrame, ctx) -> None:
    """In-process: the riskiest customers of the latest week, as JSON a person can read."""
    latest = scores[scores["week"] == scores["week"].max()]
    top = latest.sort_values(["risk", "customer_id"], ascending=[False, True]).head(5)
    summary = {"week": str(latest["week"].max()), "customers": int(latest["customer_id"].nunique()),
               "riskiest": [int(c) for c in top["customer_id"]]}
    (ctx.output_path("risk_report") / "risk.json").write_text(json.dumps(summary, indent=2))
