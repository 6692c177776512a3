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
def test_written_files_in_key_order_are_counted_a_batch_at_a_time(tmp_path, name, proven):
    """What Spark's written output gives (a file per task, read back a batch of key columns at a time,
    here two rows): a count where their order proves it, else None (a Spark job counts them)."""
    files = []
    for number, table in enumerate(CASES[name]):
        files.append(tmp_path / f"part-{number}.parquet")
        pq.write_table(table.append_column("other", pa.array(["x"] * table.num_rows)), files[-1])
    counted = distinct_in_order(files, KEY, batch_rows=2)
    assert counted == (distinct(CASES[name]) if proven else None)
