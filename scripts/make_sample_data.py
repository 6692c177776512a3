"""Writes the small, seeded sample of raw events used by configs/quickstart.yaml.

Real logs are dirty, so the sample is too: duplicate event ids, a few rows with a
malformed amount or a missing customer, and events out of time order.
"""

from __future__ import annotations

import argparse
import csv
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

EVENT_TYPES = ["view", "view", "view", "login", "purchase", "support_ticket"]


def make_rows(customers: int, days: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    start = datetime(2026, 9, 7, tzinfo=timezone.utc)
    rows = []
    for event_id in range(1, customers * days // 2 + 1):
        ts = start + timedelta(seconds=rng.randrange(days * 86400))
        kind = rng.choice(EVENT_TYPES)
        amount = f"{rng.uniform(3, 180):.2f}" if kind == "purchase" else ""
        rows.append({"event_id": event_id, "customer_id": rng.randrange(1, customers + 1),
                     "ts": ts.strftime("%Y-%m-%dT%H:%M:%SZ"), "event_type": kind, "amount": amount})
    for row in rng.sample(rows, len(rows) // 40):  # duplicates delivered twice by the collector
        rows.append(dict(row))
    for row in rng.sample(rows, len(rows) // 60):  # malformed: no customer, or a broken amount
        if rng.random() < 0.5:
            row["customer_id"] = ""
        else:
            row["amount"], row["event_type"] = "-1.00", "purchase"
    rng.shuffle(rows)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--customers", type=int, default=40)
    parser.add_argument("--days", type=int, default=28)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent.parent / "data/sample/events.csv")
    args = parser.parse_args()
    rows = make_rows(args.customers, args.days, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
