"""Features on Dask: rolling per-customer activity, trends, encodings, the churn label and the split."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa

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
    if not isinstance(customer_weeks._meta, pd.DataFrame):  # cuDF on the GPU; what follows is pandas code
        customer_weeks = customer_weeks.to_backend("pandas")
    meta = _customer_features(customer_weeks._meta, **options)
    # every week of a customer in one partition, then plain pandas per customer
    return customer_weeks.shuffle("customer_id").map_partitions(_customer_features, meta=meta, **options)


def _combine_deliveries(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per customer-week: the ETL gives one per delivery (late events arrive a week later).
    Counts add up; active days are the days set in any delivery's weekday mask."""
    keys = ["customer_id", "week"]
    summed = ["events", "views", "logins", "purchases", "tickets", "revenue"]
    values = rows[summed].astype("float64")
    mask = rows["active_day_mask"].to_numpy(dtype="int64")
    days = pd.DataFrame({f"day{d}": (mask >> d) & 1 for d in range(7)}, index=rows.index)
    frame = pd.concat([rows[keys], values, days, rows[["plan", "country", "signup_date"]]], axis=1)
    grouped = frame.groupby(keys, sort=False)
    combined = grouped[summed].sum()
    combined["active_days"] = grouped[list(days.columns)].max().sum(axis=1).astype("float64")
    static = grouped[["plan", "country", "signup_date"]].first()
    return combined.join(static).reset_index()


def _customer_features(part: pd.DataFrame, last_week: dt.date, horizon: int, test_weeks: int,
                       valid_weeks: int) -> pd.DataFrame:
    """Plain pandas on one partition, which holds every week of its customers."""
    counts = ["events", "views", "logins", "purchases", "tickets", "active_days"]
    rows = _combine_deliveries(part.assign(week=pd.to_datetime(part["week"].astype("datetime64[ms]"))))
    # every week of every customer from their first active week to the last week of the data
    first = rows.groupby("customer_id")["week"].min()
    spans = ((pd.Timestamp(last_week) - first).dt.days // 7 + 1).astype("int64")
    grid = pd.DataFrame({"customer_id": np.repeat(first.index.to_numpy(), spans.to_numpy())})
    offsets = np.arange(len(grid)) - np.repeat(np.cumsum(spans.to_numpy()) - spans.to_numpy(), spans.to_numpy())
    grid["week"] = np.repeat(first.to_numpy(), spans.to_numpy()) + pd.to_timedelta(offsets * 7, "D")
    dense = grid.merge(rows, on=["customer_id", "week"], how="left")
    dense[counts] = dense[counts].astype("float64").fillna(0)
    dense["revenue"] = dense["revenue"].astype("float64").fillna(0.0)
    for column in ("plan", "country", "signup_date"):  # static per customer
        dense[column] = dense.groupby("customer_id")[column].transform("first")
    by = dense.groupby("customer_id")
    rolled = lambda column, window, how: getattr(by[column].rolling(window, min_periods=1), how)().to_numpy()  # noqa: E731
    dense["events_4w"] = rolled("events", 4, "mean")
    dense["tickets_4w"] = rolled("tickets", 4, "sum")
    recent = rolled("events", 2, "mean")
    before = by["events"].shift(2).groupby(dense["customer_id"]).rolling(2, min_periods=1).mean().to_numpy()
    dense["events_trend"] = recent - np.where(np.isnan(before), dense["events"], before)
    dense["weeks_inactive_4w"] = (dense["events"] == 0).astype(float).groupby(dense["customer_id"]) \
        .rolling(4, min_periods=1).sum().to_numpy()
    future = sum(by["events"].shift(-k) for k in range(1, horizon + 1))
    dense["churned"] = (future == 0).astype("float64").where(future.notna())
    dense["tenure_weeks"] = ((dense["week"] - pd.to_datetime(dense["signup_date"].astype("datetime64[ms]")))
                             .dt.days // 7).astype("float64")
    dense["plan_code"] = dense["plan"].map({p: float(i) for i, p in enumerate(PLANS)}).fillna(-1.0).astype(float)
    dense["country_code"] = dense["country"].map({c: float(i) for i, c in enumerate(COUNTRIES)}).fillna(-1.0) \
        .astype(float)
    dense["week"] = dense["week"].dt.date
    out = dense[dense["events"] > 0][["customer_id", "week", *FEATURES, "churned"]].reset_index(drop=True)
    labelled_end = last_week - dt.timedelta(weeks=horizon)
    test_from = labelled_end - dt.timedelta(weeks=test_weeks - 1)
    valid_from = test_from - dt.timedelta(weeks=valid_weeks)
    week = pd.Series(out["week"].values)
    split = np.where(week > labelled_end, "unlabelled",
                     np.where(week >= test_from, "test", np.where(week >= valid_from, "valid", "train")))
    out["split"] = split
    types = {"customer_id": "int64[pyarrow]", "week": pd.ArrowDtype(pa.date32()),
             "split": "string[pyarrow]", "churned": "float64[pyarrow]", **{f: "float64[pyarrow]" for f in FEATURES}}
    return out.astype(types)
