"""Features on Dask: rolling per-customer activity, trends, encodings, the churn label and the split."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd

PLANS = ["free", "pro", "team"]
COUNTRIES = ["BR", "DE", "FR", "GB", "IN", "US"]
FEATURES = ["events", "views", "logins", "purchases", "tickets", "revenue", "active_days", "events_4w",
            "tickets_4w", "events_trend", "weeks_inactive_4w", "tenure_weeks", "plan_code", "country_code"]


def features(customer_weeks, horizon: int, test_weeks: int, valid_weeks: int):
    """One row per customer and week in which the customer was active, with the label
    `churned` = no activity at all in the next `horizon` weeks, and a time-based split."""
    last_week = pd.Timestamp(customer_weeks["week"].astype("datetime64[ms]").max().compute()).date()
    options = {"last_week": last_week, "horizon": horizon,
               "test_weeks": test_weeks, "valid_weeks": valid_weeks}
    meta = _customer_features(customer_weeks._meta, **options)
    # every week of a customer in one partition, then plain pandas per customer
    return customer_weeks.shuffle("customer_id").map_partitions(_customer_features, meta=meta, **options)


def _customer_features(part: pd.DataFrame, last_week: dt.date, horizon: int, test_weeks: int,
                       valid_weeks: int) -> pd.DataFrame:
    counts = ["events", "views", "logins", "purchases", "tickets", "active_days"]
    frames = []
    for customer, rows in part.groupby("customer_id", sort=False):
        rows = rows.set_index(pd.to_datetime(rows["week"].astype("datetime64[ms]")))
        weeks = pd.date_range(rows.index.min(), pd.Timestamp(last_week), freq="7D")
        dense = rows.reindex(weeks)
        dense[counts] = dense[counts].astype("float64").fillna(0)
        dense["revenue"] = dense["revenue"].astype("float64").fillna(0.0)
        rolling = dense["events"].rolling(4, min_periods=1)
        dense["events_4w"] = rolling.mean()
        dense["tickets_4w"] = dense["tickets"].rolling(4, min_periods=1).sum()
        dense["events_trend"] = dense["events"].rolling(2, min_periods=1).mean() - \
            dense["events"].shift(2).rolling(2, min_periods=1).mean().fillna(dense["events"])
        dense["weeks_inactive_4w"] = (dense["events"] == 0).astype(float).rolling(4, min_periods=1).sum()
        future = sum(dense["events"].shift(-k) for k in range(1, horizon + 1))
        dense["churned"] = (future == 0).astype("float64").where(future.notna())
        static = rows.iloc[0]
        dense["customer_id"] = customer
        dense["week"] = weeks.date
        signup = pd.Timestamp(static["signup_date"])
        dense["tenure_weeks"] = ((weeks - signup).days // 7).astype("float64")
        dense["plan_code"] = float(PLANS.index(static["plan"])) if static["plan"] in PLANS else -1.0
        dense["country_code"] = float(COUNTRIES.index(static["country"])) if static["country"] in COUNTRIES else -1.0
        frames.append(dense[dense["events"] > 0])
    columns = ["customer_id", "week", *FEATURES, "churned"]
    out = pd.concat(frames) if frames else pd.DataFrame(columns=columns)
    out = out[columns].reset_index(drop=True)
    labelled_end = last_week - dt.timedelta(weeks=horizon)
    test_from = labelled_end - dt.timedelta(weeks=test_weeks - 1)
    valid_from = test_from - dt.timedelta(weeks=valid_weeks)
    week = pd.Series(out["week"].values)
    split = np.where(week > labelled_end, "unlabelled",
                     np.where(week >= test_from, "test", np.where(week >= valid_from, "valid", "train")))
    out["split"] = split
    types = {"customer_id": "int64[pyarrow]", "week": pd.ArrowDtype(__import__("pyarrow").date32()),
             "split": "string[pyarrow]", "churned": "float64[pyarrow]", **{f: "float64[pyarrow]" for f in FEATURES}}
    return out.astype(types)
