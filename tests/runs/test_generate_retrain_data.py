"""The retrain data generator: deterministic, dirty on purpose, and able to append a week."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.dataset as pads
import pyarrow.parquet as pq

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "generate_retrain_data.py"


def generate(out: Path, *args: str) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--customers", "300", *args],
                   check=True, capture_output=True)


def events(out: Path):
    return pads.dataset(out / "events", format="parquet", partitioning="hive").to_table().sort_by(
        [("delivery_week", "ascending"), ("event_id", "ascending"), ("customer_id", "ascending")])


def test_appending_a_week_gives_the_same_data_as_generating_it_at_once(tmp_path):
    generate(tmp_path / "at_once", "--weeks", "4")
    generate(tmp_path / "weekly", "--weeks", "3")
    generate(tmp_path / "weekly", "--append-week")
    assert events(tmp_path / "weekly").equals(events(tmp_path / "at_once"))
    generate(tmp_path / "again", "--weeks", "4")
    assert events(tmp_path / "again").equals(events(tmp_path / "at_once"))  # seeded: same bytes of data


def test_the_raw_feed_is_dirty_like_real_logs(tmp_path):
    generate(tmp_path, "--weeks", "4")
    table = events(tmp_path).to_pandas()
    assert table["event_id"].duplicated().sum() > 0  # delivered twice
    assert table["customer_id"].isna().sum() > 0  # malformed: no customer
    assert (table["amount"].dropna() < 0).sum() > 0  # malformed: negative amount
    assert table["device"].isna().sum() > 0
    delivered = table["delivery_week"].astype(str)
    happened = (table["ts"].dt.floor("D") - table["ts"].dt.day_of_week * pd.Timedelta("1D")).dt.date
    assert (delivered != happened.astype(str)).sum() > 0  # late events land in the next week's partition


def test_a_big_delivery_is_split_into_files_of_at_most_rows_per_file_with_the_same_data(tmp_path):
    generate(tmp_path / "one_file", "--weeks", "3")
    generate(tmp_path / "split", "--weeks", "2", "--rows-per-file", "2000")
    generate(tmp_path / "split", "--append-week", "--rows-per-file", "2000")
    assert events(tmp_path / "split").equals(events(tmp_path / "one_file"))
    week = tmp_path / "split" / "events" / "delivery_week=2026-09-07"
    rows = {f.name: pq.ParquetFile(f).metadata.num_rows for f in sorted(week.glob("*.parquet"))}
    assert len([name for name in rows if name.startswith("events-")]) > 1, rows
    assert max(rows.values()) <= 2000 and rows["late-00000.parquet"] > 0, rows
