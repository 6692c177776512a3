"""Partition keys of incremental stages: one spelling per value, whichever engine wrote the directory,
and the same key whether Python's parsers or pyarrow's cast read the value."""

from __future__ import annotations

from pathlib import PurePosixPath

import pyarrow as pa
import pytest

from hybridflow.store.incremental import partition_key


@pytest.mark.parametrize("raw, kind", [
    ("2026-11-16", pa.date32()), ("2026-02-30", pa.date32()), ("20261116", pa.date32()), ("", pa.date32()),
    ("01", pa.int64()), ("-5", pa.int8()), ("300", pa.int8()), ("1_000", pa.int64()), ("+7", pa.int32()),
    ("99999999999999999999", pa.int64()), ("1.50", pa.float64()), ("x", pa.int32()), ("true", pa.bool_()),
    ("2026-11-16 10:00:00", pa.timestamp("us")), ("caf%C3%A9", pa.string()), ("__HIVE_DEFAULT_PARTITION__", pa.int64()),
])
def test_a_partition_value_is_spelled_as_pyarrow_reads_it(raw, kind):
    try:
        value = pa.array([raw], pa.string()).cast(kind)[0].as_py()
        expected = value.isoformat() if hasattr(value, "isoformat") else repr(value)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        expected = raw
    if raw in ("", "__HIVE_DEFAULT_PARTITION__"):
        expected = "__HIVE_DEFAULT_PARTITION__"
    elif kind == pa.string():
        expected = "café"
    key = partition_key(PurePosixPath(f"k={raw}/part-0.parquet"), ("k",), {"k": kind})
    assert key == f"k={expected}"


def test_engines_spelling_a_value_differently_get_one_key():
    types = {"month": pa.int32(), "day": pa.date32()}
    keys = {partition_key(PurePosixPath(f"month={m}/day=2026-01-05/part-0.parquet"), ("month", "day"), types)
            for m in ("1", "01", "001")}
    assert keys == {"month=1/day=2026-01-05"}
