"""Deterministic raw data for the weekly churn retrain (configs/weekly_retrain.yaml).

Writes, under --out (default data/retrain):
    customers.parquet                          customer_id, signup_date, plan, country, age_band
    events/delivery_week=YYYY-MM-DD/*.parquet  event_id, customer_id, ts (UTC), event_type, amount, device

one partition per weekly delivery, with the dirt real logs have: events delivered twice in the same
delivery (same event_id), late events that arrive with the following week's delivery, null devices,
and malformed rows (no customer, negative amount).

Churn has a planted, learnable signal: in the three weeks before a customer stops for good, their
activity fades and their support tickets rise; free-plan customers churn more often.

    python scripts/generate_retrain_data.py                      # 2,000 customers, 12 weeks
    python scripts/generate_retrain_data.py --append-week        # the next week, as a weekly feed
    python scripts/generate_retrain_data.py --customers 200000 --weeks 52   # benchmark scale
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

FIRST_WEEK = dt.date(2026, 8, 31)  # a Monday
PLANS = np.array(["free", "pro", "team"])
COUNTRIES = np.array(["DE", "FR", "GB", "US", "IN", "BR"])
DEVICES = np.array(["web", "ios", "android"])
EVENT_TYPES = np.array(["view", "login", "purchase", "support_ticket"])


def customers_table(n: int, rng: np.random.Generator) -> pa.Table:
    signup = FIRST_WEEK - dt.timedelta(days=1)
    days = rng.integers(0, 400, n)
    return pa.table({
        "customer_id": pa.array(np.arange(1, n + 1, dtype=np.int64)),
        "signup_date": pa.array([signup - dt.timedelta(days=int(d)) for d in days], pa.date32()),
        "plan": pa.array(PLANS[rng.choice(3, n, p=[0.55, 0.3, 0.15])]),
        "country": pa.array(COUNTRIES[rng.integers(0, len(COUNTRIES), n)]),
        "age_band": pa.array(rng.choice(["18-24", "25-34", "35-49", "50+"], n)),
    })


def churn_weeks(customers: pa.Table, horizon: int, rng: np.random.Generator) -> np.ndarray:
    """The week each customer stops for good (horizon = never within the data)."""
    free = np.array(customers.column("plan").to_pylist()) == "free"
    weekly_hazard = np.where(free, 0.05, 0.02)
    weeks = rng.geometric(weekly_hazard) + 2  # nobody churns in the first weeks
    return np.minimum(weeks, horizon + 100)


def week_events(week: int, customers: pa.Table, churn: np.ndarray, next_id: int,
                rng: np.random.Generator) -> tuple[pa.Table, pa.Table]:
    """(events of this week, late events of this week that arrive in the next partition)."""
    ids = customers.column("customer_id").to_numpy()
    weeks_left = churn - week
    active = weeks_left > 0
    fade = np.select([weeks_left == 1, weeks_left == 2, weeks_left == 3], [0.25, 0.45, 0.7], 1.0)
    base = rng.gamma(4.0, 2.0, len(ids))
    counts = np.where(active, rng.poisson(base * fade), 0)
    owners = np.repeat(ids, counts)
    ticket_p = np.repeat(np.where(weeks_left <= 3, 0.25, 0.04), counts)
    n = len(owners)
    kinds = np.where(rng.random(n) < ticket_p, "support_ticket",
                     EVENT_TYPES[rng.choice(3, n, p=[0.7, 0.2, 0.1])])
    start = dt.datetime.combine(FIRST_WEEK + dt.timedelta(weeks=week), dt.time(), dt.timezone.utc)
    offsets = rng.integers(0, 7 * 86400 * 10**6, n).astype("timedelta64[us]")
    ts = np.datetime64(start.replace(tzinfo=None), "us") + offsets
    cents = np.where(kinds == "purchase", rng.integers(300, 20000, n), -1)
    amount = decimal_amounts(cents)
    device = DEVICES[rng.integers(0, 3, n)].astype(object)
    device[rng.random(n) < 0.03] = None
    table = pa.table({
        "event_id": pa.array(np.arange(next_id, next_id + n, dtype=np.int64)),
        "customer_id": pa.array(owners),
        "ts": pa.array(ts, pa.timestamp("us", "UTC")),
        "event_type": pa.array(kinds),
        "amount": amount,
        "device": pa.array(device, pa.string()),
    })
    late = rng.random(table.num_rows) < 0.02
    # a delivery repeats some of its own events: duplicates never span two deliveries
    return _dirty(table.filter(pa.array(~late)), rng), _dirty(table.filter(pa.array(late)), rng)


def decimal_amounts(cents: np.ndarray) -> pa.Array:
    """decimal(10,2) amounts from integer cents; negative cents mean no amount (null). Built from the
    unscaled 128-bit integers directly: exact, and far faster than Python Decimals."""
    cents = np.asarray(cents, dtype=np.int64)
    words = np.stack([cents, np.where(cents < 0, -1, 0)], axis=1).astype("<i8")  # little-endian int128
    valid = pa.array(cents >= 0).buffers()[1]
    return pa.Array.from_buffers(pa.decimal128(10, 2), len(cents), [valid, pa.py_buffer(words.tobytes())],
                                 null_count=int((cents < 0).sum()))


def _dirty(table: pa.Table, rng: np.random.Generator) -> pa.Table:
    """Duplicate deliveries of 2% of the events, and 0.5% malformed rows (no customer, or an amount of -1)."""
    n = table.num_rows
    duplicates = table.take(pa.array(rng.choice(n, n // 50, replace=False))) if n >= 50 else table.slice(0, 0)
    malformed = rng.random(n) < 0.005
    no_customer = malformed & (rng.random(n) < 0.5)
    customer = pc.if_else(pa.array(no_customer), pa.scalar(None, pa.int64()), table.column("customer_id"))
    negative = pa.array(np.full(n, -1, dtype=np.int8)).cast(pa.decimal128(10, 2))  # int8: fits the precision
    amount = pc.if_else(pa.array(malformed & ~no_customer), negative, table.column("amount"))
    table = table.set_column(1, "customer_id", customer).set_column(4, "amount", amount)
    return pa.concat_tables([table, duplicates])


def write_week(out: Path, week: int, table: pa.Table) -> None:
    folder = out / "events" / f"delivery_week={FIRST_WEEK + dt.timedelta(weeks=week)}"
    folder.mkdir(parents=True, exist_ok=True)
    part = len(list(folder.glob("*.parquet")))
    pq.write_table(table, folder / f"part-{part:05d}.parquet")


def existing_weeks(out: Path) -> int:
    """Full weeks already written: the last partition holds only the late arrivals of the week before."""
    return len(list((out / "events").glob("delivery_week=*"))) - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--customers", type=int, default=2000)
    parser.add_argument("--weeks", type=int, default=12)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "data" / "retrain")
    parser.add_argument("--append-week", action="store_true", help="add the next week to an existing dataset")
    args = parser.parse_args()
    # One random stream per (seed, week): the same data whether written at once or week by week.
    customers = customers_table(args.customers, np.random.default_rng([args.seed, 0]))
    churn = churn_weeks(customers, args.weeks, np.random.default_rng([args.seed, 1]))
    first = existing_weeks(args.out) if args.append_week else 0
    weeks = range(first, first + 1) if args.append_week else range(args.weeks)
    if not args.append_week:
        args.out.mkdir(parents=True, exist_ok=True)
        pq.write_table(customers, args.out / "customers.parquet")
    total = 0
    for week in weeks:
        rng = np.random.default_rng([args.seed, 2, week])
        table, late = week_events(week, customers, churn, 10**7 * (week + 1), rng)
        write_week(args.out, week, table)
        write_week(args.out, week + 1, late)  # arrives with the next week's delivery
        total += table.num_rows + late.num_rows
    print(f"wrote {total:,} events for weeks {weeks.start}..{weeks.stop - 1} of {args.customers:,} customers "
          f"to {args.out}")


if __name__ == "__main__":
    main()
