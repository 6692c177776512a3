"""A unique check's distinct keys, counted from batches as the Arrow engines measure them: batches
whose keys rise, and whose spans are apart, are counted without hashing; every other case is
counted exactly over the keys the batches kept (or left to the engine when they kept none)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.backends.checkplan import batch_keys, count_distinct, distinct_in_order

KEY = ("customer", "week")


def batches(*rows_of_each: list[tuple]) -> list[pa.Table]:
    return [pa.table({"customer": [r[0] for r in rows], "week": [r[1] for r in rows]},
                     schema=pa.schema([("customer", pa.int64()), ("week", pa.float64())]))
            for rows in rows_of_each]


def distinct(tables: list[pa.Table]) -> int:
    return len({(row["customer"], row["week"]) for t in tables for row in t.to_pylist()})


CASES = {
    "rising, apart": batches([(1, 1.0), (1, 2.0), (2, 0.0)], [(3, 0.0), (3, 1.0)]),
    "rising, out of order between batches": batches([(5, 0.0), (6, 0.0)], [(1, 0.0), (2, 0.0)]),
    "a key repeated in the next batch": batches([(1, 1.0), (2, 0.0)], [(2, 0.0), (3, 0.0)]),
    "spans overlapping, keys distinct": batches([(1, 0.0), (4, 0.0)], [(2, 0.0), (3, 0.0)]),
    "a key repeated in one batch": batches([(1, 1.0), (1, 1.0), (2, 0.0)]),
    "descending": batches([(3, 0.0), (2, 0.0), (1, 0.0)]),
    "NULLs, as one value": batches([(1, None), (1, None), (None, 2.0)]),
    "NaN and -0.0 between batches": batches([(1, float("nan"))], [(1, float("nan"))], [(2, -0.0)], [(2, 0.0)]),
    "empty batches": batches([], [(1, 0.0)], []),
}


@pytest.mark.parametrize("name", CASES)
def test_distinct_keys_are_counted_exactly(name):
    tables = CASES[name]
    assert count_distinct([batch_keys(t, KEY) for t in tables], KEY) == distinct(tables)


@pytest.mark.parametrize(("name", "proven"), [("rising, apart", True), ("rising, out of order between batches", True),
                                              ("a key repeated in the next batch", False),
                                              ("spans overlapping, keys distinct", False), ("descending", False),
                                              ("NULLs, as one value", False), ("NaN and -0.0 between batches", False),
                                              ("empty batches", True)])
def test_without_kept_keys_only_rising_batches_apart_are_counted(name, proven):
    """What Ray's blocks send (no keys): a count only where rising keys prove it, else None (Ray's groupby counts)."""
    tables = CASES[name]
    counted = count_distinct([batch_keys(t, KEY, keep=False) for t in tables], KEY)
    assert counted == (distinct(tables) if proven else None)


@pytest.mark.parametrize(("name", "proven"), [("rising, apart", True), ("rising, out of order between batches", True),
                                              ("a key repeated in the next batch", False),
                                              ("spans overlapping, keys distinct", False), ("descending", False),
                                              ("NULLs, as one value", False), ("NaN and -0.0 between batches", False),
                                              ("empty batches", True)])
def test_written_files_in_key_order_are_counted_a_row_group_at_a_time(tmp_path, name, proven):
    """What an engine's written output gives (a file per task, its key columns read back a row group at
    a time, here two rows): a count where their order proves it, else None (the engine counts them)."""
    files = []
    for number, table in enumerate(CASES[name]):
        files.append(tmp_path / f"part-{number}.parquet")
        pq.write_table(table.append_column("other", pa.array(["x"] * table.num_rows)), files[-1], row_group_size=2)
    counted = distinct_in_order(files, KEY)
    assert counted == (distinct(CASES[name]) if proven else None)


@pytest.mark.parametrize("rows", [[(1, 1), (1, 2), (2, 0)], [(1, 2), (1, 2)], [(1, 2), (1, 1)], [(2, 0), (1, 5)],
                                  [(1, 0), (2, 0), (2, 0)], [(0, 9), (1, 0)]])
def test_integer_and_time_keys_are_proven_as_other_keys_are(rows):
    """Keys of integers and times are compared by numpy, others by Arrow's kernels: the same verdict."""
    def keys_as(first: pa.DataType, second: pa.DataType) -> pa.Table:
        return pa.table({"customer": pa.array([r[0] for r in rows]).cast(first),
                         "week": pa.array([r[1] for r in rows], pa.int32()).cast(second)})

    expected = batch_keys(keys_as(pa.float64(), pa.float64()), KEY, keep=False).span is not None
    assert expected == (len(set(rows)) == len(rows) and rows == sorted(rows))
    for types in [(pa.int64(), pa.int32()), (pa.timestamp("us", "UTC"), pa.int8()), (pa.int16(), pa.date32())]:
        assert (batch_keys(keys_as(*types), KEY, keep=False).span is not None) == expected, types
