"""The newest value of a timestamp or date column, read from Parquet max statistics exactly as an engine
reading the column gives it (its unit, its time zone), and left out wherever the statistics cannot
tell: a row group without them, an INT96 column, a column that is not a time."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from hybridflow.data.footers import read_footers

MOMENT = dt.datetime(2026, 11, 20, 12, 30, 15, 123456)
TYPES = [pa.timestamp("s"), pa.timestamp("ms", tz="Europe/Paris"), pa.timestamp("us", tz="UTC"),
         pa.timestamp("ns"), pa.timestamp("ns", tz="America/New_York"), pa.date32(), pa.date64()]


def write(folder: Path, name: str, table: pa.Table, **options) -> Path:
    path = folder / name
    pq.write_table(table, path, row_group_size=2, **options)
    return path


@pytest.mark.parametrize("kind", TYPES, ids=str)
def test_the_newest_value_is_the_one_the_column_holds(tmp_path, kind):
    values = [MOMENT - dt.timedelta(days=d) for d in (3, 0, 5)]
    if pa.types.is_date(kind):
        values = [v.date() for v in values]
    column = pa.array(values, pa.timestamp("us")).cast(kind, safe=False) if not pa.types.is_date(kind) \
        else pa.array(values, kind)
    files = [write(tmp_path, "a.parquet", pa.table({"t": column})),
             write(tmp_path, "b.parquet", pa.table({"t": column.slice(2)}))]
    newest = read_footers("events", files, newest=["t"]).newest
    read = pq.read_table(files[0]).column("t")  # what an engine reading the files gets
    assert newest == {"t": pc.max(read).as_py()}
    assert str(newest["t"]) == str(pc.max(read).as_py())  # the same zone, the same precision


def test_what_the_statistics_cannot_tell_is_left_to_the_engine(tmp_path):
    times = pa.array([MOMENT, None, MOMENT], pa.timestamp("us"))
    table = pa.table({"t": times, "n": pa.array([1, 2, 3]), "none": pa.nulls(3, pa.timestamp("us"))})
    with_stats = write(tmp_path, "with.parquet", table)
    without = write(tmp_path, "without.parquet", table, write_statistics=["n"])
    int96 = write(tmp_path, "int96.parquet", table, use_deprecated_int96_timestamps=True)

    assert read_footers("e", [with_stats], newest=["t", "n", "none", "absent"]).newest == {"t": MOMENT, "none": None}
    assert read_footers("e", [with_stats, without], newest=["t"]).newest == {}
    assert read_footers("e", [int96], newest=["t"]).newest == {}
    empty = write(tmp_path, "empty.parquet", table.slice(0, 0))
    assert read_footers("e", [empty], newest=["t"]).newest == {"t": None}
