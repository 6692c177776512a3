"""Deterministic raw data for the weekly churn retrain (configs/weekly_retrain.yaml).

Writes, under --out (default data/retrain):
    customers.parquet                          customer_id, signup_date, plan, country, age_band
    events/delivery_week=YYYY-MM-DD/*.parquet  event_id, customer_id, ts (UTC), event_type, amount, device

one partition per weekly delivery, with the dirt real logs have: events delivered twice in the same
delivery (same event_id), late events that arrive with the following week's delivery, null devices,
and malformed rows (no customer, negative amount). A delivery holds events-NNNNN.parquet (its own
week's events) and late-NNNNN.parquet (the week before's late arrivals), each file at most
--rows-per-file rows (about 128 MB), so a big week is several files of a sensible size.

Churn has a planted, learnable signal: in the three weeks before a customer stops for good, their
activity fades and their support tickets rise; free-plan customers churn more often.

    python scripts/generate_retrain_data.py                      # 2,000 customers, 12 weeks (~167,000 events)
    python scripts/generate_retrain_data.py --append-week        # the next week, as a weekly feed
    python scripts/generate_retrain_data.py --customers 600000   # ~50M events, a few minutes

Fast at any size: every column is computed with numpy over integer codes (strings come from taking a
handful of names from a small Arrow array, nulls are validity masks), and the data is generated and
written one week and one block of customers at a time, so memory stays bounded. Each (seed, week,
block) has its own random stream: the data is the same whether written at once or week by week.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FIRST_WEEK = dt.date(2026, 8, 31)  # a Monday
PLANS = pa.array(["free", "pro", "team"])
COUNTRIES = pa.array(["DE", "FR", "GB", "US", "IN", "BR"])
AGE_BANDS = pa.array(["18-24", "25-34", "35-49", "50+"])
DEVICES = pa.array(["web", "ios", "android"])
EVENT_TYPES = pa.array(["view", "login", "purchase", "support_ticket"])
PURCHASE, TICKET = 2, 3  # codes in EVENT_TYPES
FREE = 0  # code in PLANS
BLOCK = 100_000  # customers per random stream of a week: bounds memory whatever the number of customers
ROWS_PER_FILE = 8_000_000  # about 120 MB of Parquet at ~15 bytes per event
EVENTS_SCHEMA = pa.schema([("event_id", pa.int64()), ("customer_id", pa.int64()),
                           ("ts", pa.timestamp("us", "UTC")), ("event_type", pa.string()),
                           ("amount", pa.decimal128(10, 2)), ("device", pa.string())])
MICROS_PER_WEEK = 7 * 86400 * 10**6


@dataclass(frozen=True)
class Customers:
    """Every customer as numpy columns; categories as integer codes into the small Arrow arrays above."""

    ids: np.ndarray
    signup: np.ndarray  # datetime64[D]
    plan: np.ndarray
    country: np.ndarray
    age_band: np.ndarray

    def table(self) -> pa.Table:
        return pa.table({
            "customer_id": pa.array(self.ids),
            "signup_date": pa.array(self.signup, pa.date32()),
            "plan": PLANS.take(pa.array(self.plan)),
            "country": COUNTRIES.take(pa.array(self.country)),
            "age_band": AGE_BANDS.take(pa.array(self.age_band)),
        })


def make_customers(n: int, rng: np.random.Generator) -> Customers:
    signup = np.datetime64(FIRST_WEEK - dt.timedelta(days=1), "D")
    return Customers(
        ids=np.arange(1, n + 1, dtype=np.int64),
        signup=signup - rng.integers(0, 400, n).astype("timedelta64[D]"),
        plan=rng.choice(3, n, p=[0.55, 0.3, 0.15]).astype(np.int8),
        country=rng.integers(0, len(COUNTRIES), n, dtype=np.int8),
        age_band=rng.integers(0, len(AGE_BANDS), n, dtype=np.int8),
    )


def churn_weeks(plan: np.ndarray, horizon: int, rng: np.random.Generator) -> np.ndarray:
    """The week each customer stops for good (horizon + 100 at most: never within the data)."""
    weekly_hazard = np.where(plan == FREE, 0.05, 0.02)
    weeks = rng.geometric(weekly_hazard) + 2  # nobody churns in the first weeks
    return np.minimum(weeks, horizon + 100)


def block_events(week: int, ids: np.ndarray, churn: np.ndarray, first_id: int,
                 rng: np.random.Generator) -> tuple[pa.Table, pa.Table]:
    """(this week's events of one block of customers, those of them that arrive late: in the next
    delivery). A customer's activity fades and their tickets rise in the three weeks before churn."""
    weeks_left = churn - week
    fade = np.select([weeks_left == 1, weeks_left == 2, weeks_left == 3], [0.25, 0.45, 0.7], 1.0)
    base = rng.gamma(4.0, 2.0, len(ids))
    counts = np.where(weeks_left > 0, rng.poisson(base * fade), 0)
    owners = np.repeat(ids, counts)
    n = len(owners)
    assert n < 10**7, "event ids give each block of customers 10**7 ids a week"
    ticket_p = np.repeat(np.where(weeks_left <= 3, 0.25, 0.04), counts)
    kinds = np.where(rng.random(n) < ticket_p, TICKET, rng.choice(3, n, p=[0.7, 0.2, 0.1])).astype(np.int8)
    week_start = np.datetime64(FIRST_WEEK + dt.timedelta(weeks=week), "us").astype(np.int64)
    columns = {
        "event_id": first_id + np.arange(n, dtype=np.int64),
        "customer_id": owners,
        "ts": week_start + rng.integers(0, MICROS_PER_WEEK, n),
        "kind": kinds,
        "cents": np.where(kinds == PURCHASE, rng.integers(300, 20000, n), -1),
        "device": rng.integers(0, len(DEVICES), n, dtype=np.int8),
        "no_device": rng.random(n) < 0.03,
    }
    late = rng.random(n) < 0.02
    # a delivery repeats some of its own events: duplicates never span two deliveries
    return _dirty(columns, np.flatnonzero(~late), rng), _dirty(columns, np.flatnonzero(late), rng)


def _dirty(columns: dict[str, np.ndarray], rows: np.ndarray, rng: np.random.Generator) -> pa.Table:
    """The events at `rows`, 0.5% of them malformed (no customer, or an amount of -1.00), and 2% of
    them delivered twice (exact copies, malformed or not)."""
    n = len(rows)
    malformed = rng.random(n) < 0.005
    no_customer = malformed & (rng.random(n) < 0.5)
    twice = rng.choice(n, n // 50, replace=False) if n >= 50 else np.empty(0, np.int64)
    order = np.concatenate([np.arange(n), twice])
    pick = rows[order]
    no_customer, negative = no_customer[order], (malformed & ~no_customer)[order]
    cents = np.where(negative, -100, columns["cents"][pick])
    return pa.table({
        "event_id": pa.array(columns["event_id"][pick]),
        "customer_id": pa.array(columns["customer_id"][pick], mask=no_customer),
        "ts": pa.array(columns["ts"][pick], pa.timestamp("us", "UTC")),
        "event_type": EVENT_TYPES.take(pa.array(columns["kind"][pick])),
        "amount": decimal_amounts(cents, valid=negative | (cents >= 0)),
        "device": DEVICES.take(pa.array(columns["device"][pick], mask=columns["no_device"][pick])),
    }, schema=EVENTS_SCHEMA)


def decimal_amounts(cents: np.ndarray, valid: np.ndarray) -> pa.Array:
    """decimal(10,2) amounts from integer cents (null where not `valid`). Built from the unscaled
    128-bit integers directly: exact, and far faster than Python Decimals."""
    cents = np.asarray(cents, dtype=np.int64)
    words = np.empty((len(cents), 2), dtype="<i8")  # little-endian int128: low word, then sign
    words[:, 0] = cents
    words[:, 1] = np.where(cents < 0, -1, 0)
    validity = pa.array(valid).buffers()[1]
    return pa.Array.from_buffers(pa.decimal128(10, 2), len(cents), [validity, pa.py_buffer(words)],
                                 null_count=int(len(cents) - np.count_nonzero(valid)))


class Files:
    """One delivery's files of one kind (prefix-NNNNN.parquet), each at most rows_per_file rows."""

    def __init__(self, folder: Path, prefix: str, rows_per_file: int) -> None:
        self.folder, self.prefix, self.limit = folder, prefix, rows_per_file
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0
        self.count = 0

    def write(self, table: pa.Table) -> None:
        while table.num_rows:
            if self.writer is None or self.rows >= self.limit:
                self._next_file()
            part = table.slice(0, self.limit - self.rows)
            self.writer.write_table(part)
            self.rows += part.num_rows
            table = table.slice(part.num_rows)

    def _next_file(self) -> None:
        self._finish()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.writer = pq.ParquetWriter(self.folder / f"{self.prefix}-{self.count:05d}.parquet", EVENTS_SCHEMA)
        self.count += 1

    def close(self) -> None:
        """Finish the open file; a delivery always gets at least one file, even an empty one."""
        if self.count == 0:
            self._next_file()
        self._finish()

    def _finish(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer, self.rows = None, 0


def delivery(out: Path, week: int) -> Path:
    return out / "events" / f"delivery_week={FIRST_WEEK + dt.timedelta(weeks=week)}"


def write_week(out: Path, week: int, customers: Customers, churn: np.ndarray, seed: int,
               rows_per_file: int) -> int:
    """Write one week's events into its delivery, and its late ones into the next; returns the rows."""
    on_time = Files(delivery(out, week), "events", rows_per_file)
    late = Files(delivery(out, week + 1), "late", rows_per_file)
    rows = 0
    for block, start in enumerate(range(0, len(customers.ids), BLOCK)):
        rng = np.random.default_rng([seed, 2, week, block])
        first_id = (week + 1) * 10**12 + block * 10**7
        tables = block_events(week, customers.ids[start:start + BLOCK], churn[start:start + BLOCK], first_id, rng)
        for files, table in zip((on_time, late), tables):
            files.write(table)
            rows += table.num_rows
    on_time.close()
    late.close()
    return rows


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
    parser.add_argument("--rows-per-file", type=int, default=ROWS_PER_FILE,
                        help=f"most events in one file (default {ROWS_PER_FILE:,}: about 128 MB)")
    args = parser.parse_args()
    clock = time.perf_counter()
    # One random stream per (seed, week, block): the same data whether written at once or week by week.
    customers = make_customers(args.customers, np.random.default_rng([args.seed, 0]))
    churn = churn_weeks(customers.plan, args.weeks, np.random.default_rng([args.seed, 1]))
    first = existing_weeks(args.out) if args.append_week else 0
    weeks = range(first, first + 1) if args.append_week else range(args.weeks)
    if not args.append_week:
        args.out.mkdir(parents=True, exist_ok=True)
        pq.write_table(customers.table(), args.out / "customers.parquet")
    total = sum(write_week(args.out, week, customers, churn, args.seed, args.rows_per_file) for week in weeks)
    seconds = time.perf_counter() - clock
    print(f"wrote {total:,} events for weeks {weeks.start}..{weeks.stop - 1} of {args.customers:,} customers "
          f"to {args.out} in {seconds:.1f}s ({total / max(seconds, 1e-9):,.0f} events/s)")


if __name__ == "__main__":
    main()
