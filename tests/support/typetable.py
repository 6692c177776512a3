"""One table holding every type of the Parquet contract, with nulls, for the engine matrix."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa

UTC = dt.timezone.utc


def every_type_table() -> pa.Table:
    return pa.table({
        "i8": pa.array([-128, 127, None], pa.int8()),
        "i16": pa.array([-32768, None, 7], pa.int16()),
        "i32": pa.array([None, 2**31 - 1, -5], pa.int32()),
        "i64": pa.array([2**62, None, -(2**62)], pa.int64()),
        "f32": pa.array([1.5, None, -0.25], pa.float32()),
        "f64": pa.array([None, 1e300, -2.5e-300], pa.float64()),
        "flag": pa.array([True, False, None], pa.bool_()),
        "text": pa.array(["héllo wörld", "", None], pa.string()),
        "blob": pa.array([b"\x00\xff", None, b""], pa.binary()),
        "day": pa.array([dt.date(1500, 1, 1), dt.date(2026, 11, 16), None], pa.date32()),
        "ts_naive": pa.array([dt.datetime(1500, 3, 1, 12, 0, 0, 1), None, dt.datetime(2300, 1, 1)],
                             pa.timestamp("us")),
        "ts_utc": pa.array([dt.datetime(2026, 3, 29, 1, 30, 0, 123456, tzinfo=UTC), None,
                            dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)], pa.timestamp("us", "UTC")),
        "amount": pa.array([Decimal("12345678.91"), None, Decimal("-0.01")], pa.decimal128(10, 2)),
        "tags": pa.array([[1, None, 3], None, []], pa.list_(pa.int64())),
        "info": pa.array([{"a": 1, "b": "x"}, None, {"a": None, "b": None}],
                         pa.struct([("a", pa.int64()), ("b", pa.string())])),
    })


# Column names an engine could misread as an expression (a.b is field b of column a to Spark) or a
# path (partition directories are named after columns); unicode and emoji as well.
ODD_NAMES = ("col.with.dot", "with space", "back`tick", "ünïcödé", "🎉", "a.b`c d[0] (e)")


def odd_names_table() -> pa.Table:
    """Small: the names are what it tests, one column of another type each."""
    values = [
        pa.array([1, None, 3], pa.int64()),
        pa.array(["x.y", None, "z z"], pa.string()),
        pa.array([1.5, 2.5, None], pa.float64()),
        pa.array([dt.date(2026, 1, 1), None, dt.date(1999, 12, 31)], pa.date32()),
        pa.array([True, None, False], pa.bool_()),
        pa.array([{"in.side": 1}, None, {"in.side": None}], pa.struct([("in.side", pa.int64())])),
    ]
    return pa.table(dict(zip(ODD_NAMES, values)))
