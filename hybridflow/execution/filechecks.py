"""What a table's own Parquet files answer of its checks, before an engine reads a row of it.

The footers count the rows and each column's NULLs, and bound an integer column's values in each row
group: a check whose failing rows those bounds rule out (every key present, a range held, an `expr`
of comparisons that holds over them) fails no row there, and a column's NULL count is exactly the
rows a `not_null` or `null_fraction` check of it fails. A timestamp's newest value is its max
statistic, and a unique key whose rows rise within each row group, the groups apart, is distinct
(checkplan.distinct_in_order). A check of one string column stored with a dictionary is judged once
per dictionary value, its rows counted by their index. The engine then measures only what is left,
over fewer columns, in the same one pass (CheckPlan.without). Local files only: in object storage
the engine's workers read the footers where the data is. Whatever the footers cannot tell, the
engine measures as before.
"""

from __future__ import annotations

import itertools
from decimal import Decimal
from pathlib import PurePath
from typing import Any

from ..backends.checkplan import ROWS, CheckPlan, distinct_in_order
from ..data.footers import ColumnStatistics, newest_in, row_group_statistics
from ..data.tables import TableSource, parquet_files

TRUE, FALSE, NULL = "true", "false", "null"
ANY = frozenset((TRUE, FALSE, NULL))
Group = tuple[int, dict[str, ColumnStatistics]]  # a row group's rows and its columns' statistics


def measure(backend, source: TableSource, plan: CheckPlan) -> dict[str, Any]:
    """Every measure of `plan` over `source`: what its files answer where they are local Parquet of no
    partition columns, the rest measured by `backend` in one pass over it."""
    known, rest = {}, plan
    if source.store is None and source.format == "parquet" and not source.partition_by:
        known, rest = answered(plan, parquet_files(source))
    if ROWS in known and len(rest.measures) == 1:  # the row count alone is left: the footers have it
        return known
    return known | backend.check_measure(backend.check_frame(source), rest)


def answered(plan: CheckPlan, files: list[PurePath]) -> tuple[dict[str, Any], CheckPlan]:
    """({alias: value} of the measures of `plan` that the files answer, the plan of those an engine
    must still measure). A file whose footer cannot be read answers nothing: the engine reports it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        footers = [pq.read_metadata(str(file)) for file in files]
    except (OSError, pa.ArrowException):
        return {}, plan
    columns = {c for m in plan.measures for c in _columns_of(m)}
    groups = [g for metadata in footers for g in row_group_statistics(metadata, sorted(columns))]
    known: dict[str, Any] = {ROWS: sum(rows for rows, _ in groups)}
    schemas = [metadata.schema.to_arrow_schema() for metadata in footers]
    kinds = _column_kinds(schemas)
    hashed = []
    for measure in plan.measures[1:]:
        if measure.op == "failing":
            modelled = _modelled(measure.predicate, kinds)
            value = _failing_rows(measure.predicate, groups) if modelled else None
            if value is None:
                value = _failing_by_dictionary(measure.predicate, files, footers, schemas)
        elif measure.op == "max":
            value = _newest(footers, schemas, measure.columns[0])
        elif all(set(measure.columns) <= set(stats) for _, stats in groups):
            # distinct: proven by the keys' order, else hashed by the engine, which need not try it again
            try:
                value = distinct_in_order(files, measure.columns, footers)
            except (OSError, pa.ArrowException):  # a row group that cannot be read: the engine reports it
                continue
            if value is None:
                hashed.append(measure.alias)
        else:  # a key column not in the files (an engine reports it)
            value = None
        if value is not None:
            known[measure.alias] = value
    return known, plan.without(known, hashed)


def _dictionary_column(predicate, footers: list, schemas: list) -> str | None:
    """The one column of `predicate`, where it is a string column every row group of every file holds
    with a dictionary; else None."""
    import pyarrow as pa
    import sqlglot.expressions as exp

    from ..data.footers import top_level_leaf

    columns = {c.name for c in predicate.find_all(exp.Column)}
    if len(columns) != 1 or not schemas:  # no file: the engine says whether the column exists
        return None
    column = columns.pop()
    strings = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)
    if not all(column in s.names and any(kind(s.field(column).type) for kind in strings) for s in schemas):
        return None
    leaves = [top_level_leaf(metadata, column) for metadata in footers]
    if None in leaves or not all(metadata.row_group(g).column(leaf).has_dictionary_page
                                 for metadata, leaf in zip(footers, leaves) for g in range(metadata.num_row_groups)):
        return None
    return column


def _failing_by_dictionary(predicate, files: list[PurePath], footers: list, schemas: list) -> int | None:
    """The rows a predicate of one string column is true on, where every row group holds it
    dictionary-encoded (a column of few values, as writers store it): the predicate is evaluated once
    per dictionary value, in Arrow as the Arrow engines evaluate it, and the rows counted by their
    index. None where a row group's column has no dictionary or Arrow cannot evaluate the predicate
    (a function, a string compared with a number); pyarrow reads only strings and binary as
    dictionaries."""
    import numpy as np
    import pyarrow as pa

    from ..backends.checkplan import arrow_expression
    from ..data.footers import each_row_group
    from ..errors import ConfigError

    column = _dictionary_column(predicate, footers, schemas)
    if column is None:
        return None
    try:
        failing = arrow_expression(predicate)
    except (ConfigError, ValueError, TypeError, OverflowError, pa.ArrowException):  # not in Arrow: the engine's
        return None

    judged: dict[tuple, Any] = {}  # row groups mostly share their few values: each set judged once

    def failing_in(reader, index: int) -> int | None:
        total = 0
        for chunk in reader.read_row_group(index, columns=[column])[column].chunks:
            if not pa.types.is_dictionary(chunk.type):
                return None
            fails = _failing_values(chunk.dictionary, column, failing, judged)
            if fails.any():
                total += int(np.count_nonzero(fails[chunk.indices.fill_null(len(chunk.dictionary)).to_numpy()]))
        return total

    try:
        counts = list(each_row_group(files, footers, failing_in, read_dictionary=[column]))
    except (OSError, ValueError, TypeError, pa.ArrowException):  # unreadable, or a type the predicate does not fit
        return None
    return None if None in counts else sum(counts)


def _failing_values(dictionary, column: str, failing, judged: dict[tuple, Any]):
    """Whether the predicate `failing` is true on each value of a dictionary, and on NULL (after them);
    a few values' answer is kept in `judged`."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    key = tuple(dictionary.to_pylist()) if len(dictionary) <= 256 else None
    if key in judged:
        return judged[key]
    values = pa.concat_arrays([dictionary, pa.nulls(1, dictionary.type)])
    flags = ds.dataset(pa.table({column: values})).to_table(columns={"f": failing})["f"]
    fails = flags.combine_chunks().fill_null(False).to_numpy(zero_copy_only=False)
    if key is not None:
        judged[key] = fails
    return fails


def _column_kinds(schemas: list) -> dict[str, str]:
    """{column: "integer" | "floating" | "other"} of the top-level columns every file has, of one kind in
    all (their types as stored)."""
    import pyarrow as pa

    kinds: dict[str, str] | None = None
    for schema in schemas:
        found = {f.name: "integer" if pa.types.is_integer(f.type) else
                 "floating" if pa.types.is_floating(f.type) else "other" for f in schema}
        kinds = found if kinds is None else {c: k for c, k in kinds.items() if found.get(c) == k}
    return kinds or {}


def _modelled(node, kinds: dict[str, str]) -> bool:
    """Whether a failing predicate is built only of what the evaluator models: boolean logic over
    comparisons of one integer column with numbers, and IS NULL of a column, over columns every file
    has. Anything else (a column the files lack, a type an engine would refuse, a function) is left to
    the engine, which measures or reports it as before. NaN is NULL to some engines: a floating
    column's NULLs are left to them too."""
    import sqlglot.expressions as exp

    comparisons = (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.EQ, exp.NEQ)
    logic = (exp.Paren, exp.Not, exp.And, exp.Or, exp.Coalesce, exp.Boolean)
    for part in node.walk():
        if isinstance(part, comparisons) or isinstance(part, exp.Between):
            operands = [part.this, part.expression] if isinstance(part, comparisons) else \
                [part.this, part.args["low"], part.args["high"]]
            columns = [o for o in operands if isinstance(o, exp.Column)]
            if part.args.get("symmetric") or len(columns) != 1 or kinds.get(columns[0].name) != "integer" or \
                    any(_number(o) is None for o in operands if o is not columns[0]):
                return False
        elif isinstance(part, exp.Is):
            if not (isinstance(part.this, exp.Column) and isinstance(part.expression, exp.Null)
                    and kinds.get(part.this.name) in ("integer", "other")):
                return False
        elif isinstance(part, exp.Identifier) and isinstance(part.parent, exp.Column):
            continue  # a column's name
        elif isinstance(part, (exp.Column, exp.Literal, exp.Neg, exp.Null)):
            if not isinstance(part.parent, (*comparisons, exp.Between, exp.Is, exp.Neg)):
                return False  # a value where a condition belongs: the engine decides what it means
        elif not isinstance(part, logic):
            return False
    return True


def _columns_of(measure) -> set[str]:
    import sqlglot.expressions as exp

    if measure.predicate is None:
        return set(measure.columns)
    return {column.name for column in measure.predicate.find_all(exp.Column)}


def _newest(footers: list, schemas: list, column: str) -> Any:
    """A timestamp or date column's newest value from every file's statistics, or None where some
    row group's do not tell it (the engine then takes it). A column of NULLs only is not answered."""
    values: list | None = []
    for metadata, stored in zip(footers, schemas):
        values = newest_in(metadata, stored, column, values)
        if values is None:
            return None
    return max(values) if values else None


def _failing_rows(predicate, groups: list[Group]) -> int | None:
    """The rows `predicate` (true where a row fails) is true on, summed over the row groups, or None
    where some group's statistics cannot tell how many."""
    total = 0
    for rows, stats in groups:
        count = _count(predicate, rows, stats)
        if count is None:
            return None
        total += count
    return total


def _count(node, rows: int, stats: dict[str, ColumnStatistics]) -> int | None:
    """The rows of one row group `node` is true on: none where its statistics rule it out, all where
    they make it certain, a column's NULL count for `column IS NULL` (or an OR of such whose other
    parts are ruled out); None otherwise."""
    import sqlglot.expressions as exp

    possible = _outcomes(node, rows, stats)
    if TRUE not in possible:
        return 0
    if possible == {TRUE}:
        return rows
    if isinstance(node, exp.Paren):
        return _count(node.this, rows, stats)
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null) and isinstance(node.this, exp.Column):
        column = stats.get(node.this.name)
        return column.nulls if column is not None else None
    if isinstance(node, exp.Or):
        live = [part for part in (node.this, node.expression) if TRUE in _outcomes(part, rows, stats)]
        return _count(live[0], rows, stats) if len(live) == 1 else None
    return None


def _outcomes(node, rows: int, stats: dict[str, ColumnStatistics]) -> frozenset:  # noqa: C901, PLR0911 - one branch per SQL construct
    """What `node` can be on some row of a row group (TRUE, FALSE, NULL), as the statistics bound its
    columns; every outcome where they cannot tell."""
    import sqlglot.expressions as exp

    if isinstance(node, exp.Paren):
        return _outcomes(node.this, rows, stats)
    if isinstance(node, exp.Boolean):
        return frozenset((TRUE if node.this else FALSE,))
    if isinstance(node, exp.Not):
        flipped = {TRUE: FALSE, FALSE: TRUE, NULL: NULL}
        return frozenset(flipped[o] for o in _outcomes(node.this, rows, stats))
    if isinstance(node, (exp.And, exp.Or)):
        joined = _and if isinstance(node, exp.And) else _or
        return frozenset(joined(a, b) for a, b in itertools.product(_outcomes(node.this, rows, stats),
                                                                     _outcomes(node.expression, rows, stats)))
    if isinstance(node, exp.Coalesce):  # COALESCE(x, ...): x where it is not NULL, else the next
        found: set[str] = set()
        for part in [node.this, *node.expressions]:
            outcomes = _outcomes(part, rows, stats)
            found |= outcomes - {NULL}
            if NULL not in outcomes:
                return frozenset(found)
        return frozenset(found | {NULL})
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null) and isinstance(node.this, exp.Column):
        column = stats.get(node.this.name)
        if column is None or column.nulls is None:
            return ANY - {NULL}
        return frozenset(([TRUE] if column.nulls else []) + ([FALSE] if column.nulls < rows else []))
    if isinstance(node, exp.Between) and not node.args.get("symmetric"):
        low = exp.GTE(this=node.this, expression=node.args["low"])
        high = exp.LTE(this=node.this, expression=node.args["high"])
        return _outcomes(exp.And(this=low, expression=high), rows, stats)
    if isinstance(node, (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.EQ, exp.NEQ)):
        return _compared(node, rows, stats)
    return ANY


def _compared(node, rows: int, stats: dict[str, ColumnStatistics]) -> frozenset:
    """A comparison of an integer column with a number, over the column's bounds in the row group."""
    import sqlglot.expressions as exp

    mirrored = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ, exp.NEQ: exp.NEQ}
    kind, left, right = type(node), node.this, node.expression
    if isinstance(right, exp.Column):
        kind, left, right = mirrored[kind], right, left
    number = _number(right)
    column = stats.get(left.name) if isinstance(left, exp.Column) else None
    if number is None or column is None or column.nulls is None:
        return ANY
    found = {NULL} if column.nulls else set()
    if column.nulls == rows:
        return frozenset(found)
    if column.low is None:
        return frozenset(found | {TRUE, FALSE})
    low, high = column.low, column.high
    can_be_true = {exp.GT: high > number, exp.GTE: high >= number, exp.LT: low < number, exp.LTE: low <= number,
                   exp.EQ: low <= number <= high, exp.NEQ: not low == high == number}[kind]
    can_be_false = {exp.GT: low <= number, exp.GTE: low < number, exp.LT: high >= number, exp.LTE: high > number,
                    exp.EQ: not low == high == number, exp.NEQ: low <= number <= high}[kind]
    return frozenset(found | ({TRUE} if can_be_true else set()) | ({FALSE} if can_be_false else set()))


def _number(node) -> int | Decimal | None:
    import sqlglot.expressions as exp

    if isinstance(node, exp.Neg):
        value = _number(node.this)
        return None if value is None else -value
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return int(node.this)
        except ValueError:  # compared exactly, as SQL reads a decimal literal, never as a binary float
            try:
                return Decimal(node.this)
            except ArithmeticError:
                return None
    return None


def _and(a: str, b: str) -> str:
    if FALSE in (a, b):
        return FALSE
    return NULL if NULL in (a, b) else TRUE


def _or(a: str, b: str) -> str:
    if TRUE in (a, b):
        return TRUE
    return NULL if NULL in (a, b) else FALSE
