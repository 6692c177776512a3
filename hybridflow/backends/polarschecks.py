"""Polars: a stage output's check measures taken in the query that writes it.

The checks' aggregate is a second sink of the stage's rows, run with the Parquet sink as one query
(`pl.collect_all`), so Polars computes the rows once for both; its one row goes to a file of its own,
read here. A unique check's keys are not hashed there: a key above the key of the row before, row
after row, is distinct from every other (the row order of the written files, where an output sorted
by its key is proven at no cost); only keys that do not prove it are counted (n_unique) over the key
columns of the written files.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from ..data.tables import TableSource
from .checkplan import ROWS

ROW_FILE = "measures.arrow"


@contextlib.contextmanager
def measured_aggregate(pl, lazy, plan) -> Iterator[tuple[Any, Path]]:
    """(a lazy sink of the measures of `plan` over `lazy`, the file it writes their row to)."""
    scratch = Path(tempfile.mkdtemp(prefix="hybridflow-polars-checks-"))
    try:
        row_file = scratch / ROW_FILE
        yield lazy.select(writing_expressions(pl, plan, lazy.collect_schema())).sink_ipc(row_file, lazy=True), row_file
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def read_measured(backend, directory: Path, stored, plan, row_file: Path) -> dict[str, Any]:
    """The measures from the aggregate's row; keys its order did not prove distinct counted over the
    written files' key columns (one query)."""
    pl = backend.pl
    values = plan.values_of(pl.read_ipc(row_file).row(0))
    distinct = [m for m in plan.measures if m.op == "distinct"]
    unproven = [m for m in distinct if values[m.alias]]
    values |= {m.alias: values[ROWS] for m in distinct}
    if unproven:
        written = backend.read(TableSource("checked", (directory,), "parquet", stored, (), directory))
        counted = written.select([pl.struct(list(m.columns)).n_unique().alias(m.alias) for m in unproven]).collect()
        values |= {m.alias: int(counted[m.alias][0]) for m in unproven}
    return values


def writing_expressions(pl, plan, schema) -> list:
    """The plan's measures as Polars expressions, a unique check's as the count of rows whose key is not
    proven distinct by the row before (all of them where its columns' types are not ordered)."""
    from .polars import check_expressions

    expressions = check_expressions(plan)
    for i, m in enumerate(plan.measures):
        if m.op == "distinct":
            ordered = all(_ordered(pl, schema[c]) for c in m.columns)
            expressions[i] = (_unproven(pl, m.columns) if ordered else pl.len()).alias(m.alias)
    return expressions


def _unproven(pl, columns: tuple[str, ...]):
    """Rows with a NULL in the key, or whose key is not above the previous row's (compared column
    after column): 0 proves every key distinct."""
    above = None
    for column in reversed(columns):
        key, before = pl.col(column), pl.col(column).shift(1)
        above = key > before if above is None else (key > before) | ((key == before) & above)
    nulls = pl.any_horizontal([pl.col(c).is_null() for c in columns])
    return (nulls | (pl.col(columns[0]).shift(1).is_not_null() & ~above.fill_null(False))).sum()


def _ordered(pl, dtype) -> bool:
    """Types whose `>` orders values as n_unique tells them apart."""
    return dtype.is_numeric() or dtype.is_temporal() or dtype in (pl.String, pl.Boolean)
