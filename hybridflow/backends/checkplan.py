"""Declared data checks turned into what an engine computes, and what they conclude.

Engine-neutral: every check becomes measures (the row count, the count of rows a SQL predicate
fails, a count of distinct keys, a column's newest value) that an engine computes in one aggregate
pass: as SQL (Spark, DuckDB), as expressions (Polars), or as Arrow partials per batch that its
workers compute and that are added up (pandas, Dask, Ray). `judge` turns the measured values into
outcomes; the engine never sends a row here except the few examples an error quotes.
"""

from __future__ import annotations

import copy
import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Any

from ..definition.datachecks import CHECK_COLUMN, Check
from ..definition.model import parse_duration
from ..errors import QUOTE_CHARS

ROWS = "hf_rows"
WHOLE_DATASET = ("freshness",)  # judged over every partition measured at once, even on a partitioned output
EXAMPLES = 3  # failing rows an error quotes (their checked columns only, each value cut short)


@dataclass(frozen=True)
class Measure:
    alias: str
    op: str  # rows | failing | distinct | max
    columns: tuple[str, ...] = ()
    predicate: Any = None  # a sqlglot expression, true where a row fails (failing)
    hashed: bool = False  # distinct keys whose order was found not to prove them distinct: count by hashing


class CheckPlan:
    """The measures one dataset's checks need, each under an alias the engine returns it by; with
    `group_by` (a partitioned output's partition columns) measured once per partition, in the same pass."""

    def __init__(self, checks: list[Check], group_by: tuple[str, ...] = ()) -> None:
        self.checks, self.group_by = checks, tuple(group_by)
        self.measures: list[Measure] = [Measure(ROWS, "rows")]
        self.alias: dict[str, str] = {}  # check name -> its measure's alias
        for i, check in enumerate(checks):
            measure = _measure_of(check, f"hf_m{i}")
            if measure is not None:
                self.measures.append(measure)
                self.alias[check.name] = measure.alias

    def without(self, known: dict[str, Any], hashed=()) -> CheckPlan:
        """This plan with only the measures not `known` (the row count stays: an engine counts it in the
        same pass); `hashed`: aliases of distinct measures an engine must count by hashing."""
        rest = copy.copy(self)
        rest.measures = [replace(m, hashed=m.alias in hashed) for m in self.measures
                         if m.op == "rows" or m.alias not in known]
        return rest

    @property
    def row_level(self) -> list[Check]:
        return [c for c in self.checks if c.row_level]

    @staticmethod
    def sql_predicate(measure: Measure, dialect: str | None) -> str:
        """A failing measure's predicate as SQL text of `dialect`."""
        return measure.predicate.sql(dialect=dialect)

    def sql_aggregates(self, dialect: str) -> list[str]:
        """`expression AS alias` for each measure, in `dialect` (spark, duckdb)."""
        return [f"{self.sql_aggregate(m, dialect)} AS {m.alias}" for m in self.measures]

    @staticmethod
    def sql_aggregate(measure: Measure, dialect: str) -> str:
        """One measure's aggregate expression, in `dialect`."""
        return _sql_measure(measure, dialect)

    def values_of(self, row) -> dict[str, Any]:
        """The measures from a row of values in the order of `measures` (an empty table sums to NULL)."""
        return {m.alias: (v if m.op == "max" else int(v or 0)) for m, v in zip(self.measures, row)}

    def sql_label(self, checks: list[Check], dialect: str | None) -> str:
        """A SQL CASE naming the first of `checks` a row fails, NULL when it passes them all."""
        import sqlglot.expressions as exp

        case = exp.Case()
        for check in checks:
            case = case.when(_predicate(check), exp.Literal.string(check.name))
        return case.sql(dialect=dialect)

    def arrow_partials(self, table, distinct: bool = True) -> dict[str, Any]:
        """The measures of one Arrow batch (a worker's part of the data), distinct keys as a table of
        them (`distinct`: False where the engine counts them itself)."""
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        failing = {m.alias: arrow_expression(m.predicate) for m in self.measures if m.op == "failing"}
        flags = ds.dataset(table).to_table(columns=failing) if failing else None
        values: dict[str, Any] = {ROWS: table.num_rows}
        for m in self.measures:
            if m.op == "failing":
                values[m.alias] = int(pc.sum(pc.cast(flags[m.alias], "int64")).as_py() or 0)
            elif m.op == "max":
                values[m.alias] = pc.max(table[m.columns[0]]).as_py() if table.num_rows else None
            elif m.op == "distinct":
                values[m.alias] = batch_keys(table, m.columns, distinct)
        return values

    def arrow_partials_by(self, table, distinct: bool = True) -> dict[tuple, dict[str, Any]]:
        """{partition values: the measures of its rows} of one Arrow batch. A worker's batch is mostly
        one file, so of one partition: each partition's rows are filtered out of it in turn."""
        import pyarrow as pa
        import pyarrow.compute as pc

        for column in self.group_by:  # pandas' categories: compared as their values
            if pa.types.is_dictionary(table.schema.field(column).type):
                table = table.set_column(table.schema.get_field_index(column), column,
                                         pc.cast(table[column], table.schema.field(column).type.value_type))
        partials = {}
        for key in _distinct_keys(table, self.group_by).to_pylist():
            rows = pc.scalar(True)
            for column, value in key.items():
                rows = rows & (pc.field(column).is_null() if value is None else pc.field(column) == value)
            partials[tuple(key.values())] = self.arrow_partials(table.filter(rows), distinct)
        return partials

    def combine_by(self, partials: list[dict[tuple, dict[str, Any]]]) -> dict[tuple, dict[str, Any]]:
        """{partition values: its measures} from those of every batch."""
        grouped: dict[tuple, list] = {}
        for batch in partials:
            for key, values in batch.items():
                grouped.setdefault(key, []).append(values)
        return {key: self.combine(parts) for key, parts in grouped.items()}

    def grouped_values(self, rows) -> dict[tuple, dict[str, Any]]:
        """{partition values: measures} from rows of the partition columns then the measures in order."""
        n = len(self.group_by)
        return {tuple(plain_value(v) for v in row[:n]): self.values_of(row[n:]) for row in rows}

    def empty(self) -> dict[str, Any]:
        """The measures of no row at all (a partition the stage wrote nothing for)."""
        return {m.alias: None if m.op == "max" else 0 for m in self.measures}

    def whole(self, groups: list[dict[str, Any]]) -> dict[str, Any]:
        """The row count and newest values of all the partitions measured: what freshness judges."""
        values = {ROWS: sum(v[ROWS] for v in groups)}
        for m in (m for m in self.measures if m.op == "max"):
            present = [v[m.alias] for v in groups if v[m.alias] is not None]
            values[m.alias] = max(present) if present else None
        return values

    def combine(self, partials: list[dict[str, Any]]) -> dict[str, Any]:
        """The measures of the whole data from those of its batches (a distinct count None where the
        batches did not keep their keys and do not prove them distinct: the engine counts them)."""
        values: dict[str, Any] = {ROWS: sum(p[ROWS] for p in partials)}
        for m in self.measures[1:]:
            parts = [p.get(m.alias) for p in partials]
            if m.op == "failing":
                values[m.alias] = sum(parts)
            elif m.op == "max":
                present = [v for v in parts if v is not None]
                values[m.alias] = max(present) if present else None
            elif m.op == "distinct":
                values[m.alias] = count_distinct(parts, m.columns)
        return values

    def arrow_label(self, table, checks: list[Check]):
        """An Arrow string array naming the first of `checks` each row fails (null: passes them all)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        flags = ds.dataset(table).to_table(columns={c.name: arrow_expression(_predicate(c)) for c in checks})
        label = pa.nulls(table.num_rows, pa.string())
        for check in reversed(checks):  # the first check a row fails is its label
            failed = pc.fill_null(flags[check.name], False)
            label = pc.if_else(failed, pa.scalar(check.name, pa.string()), label)
        return label

    def arrow_split(self, table, checks: list[Check]):
        """(rows passing every one of `checks`, the others with the name of the check they failed)."""
        import pyarrow.compute as pc

        label = self.arrow_label(table, checks)
        passed = pc.is_null(label)
        failing = table.filter(pc.invert(passed)).append_column(CHECK_COLUMN, label.filter(pc.invert(passed)))
        return table.filter(passed), failing


def plain_value(value: Any) -> Any:
    """A numpy or pandas scalar as the Python value it holds (a partition's value, named in a key)."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def partition_name(group_by: tuple[str, ...], values: tuple) -> str:
    """'delivery_week=2026-11-23': a partition as incremental.partition_key names its directory."""
    from ..data.tables import HIVE_NULL

    def text(value: Any) -> str:
        if value is None or value == "":  # engines write an empty value as a NULL one
            return HIVE_NULL
        if isinstance(value, str):
            return value
        if hasattr(value, "isoformat"):
            return value.isoformat()
        return repr(value)

    return "/".join(f"{c}={text(v)}" for c, v in zip(group_by, values))


@dataclass(frozen=True)
class BatchKeys:
    """A batch's keys of a unique check: its `rows`, whose keys rise from `span[0]` to `span[1]` when
    they are in strictly increasing order (each then differs from the others: no hashing needed), and
    `table`, its distinct keys (None where the engine counts them itself)."""

    rows: int
    span: tuple[tuple, tuple] | None
    table: Any = None


def batch_keys(table, columns: tuple[str, ...], keep: bool = True) -> BatchKeys:
    """A batch's keys: in strictly increasing order, its own rows are its distinct keys; otherwise a
    hash aggregation finds them (`keep` False: neither is kept, the engine counts them itself)."""
    keys = table.select(list(columns))
    span = _increasing_span(keys)
    if span is not None or keys.num_rows == 0:
        return BatchKeys(keys.num_rows, span, keys if keep else None)
    return BatchKeys(keys.num_rows, None, _distinct_keys(keys, columns) if keep else None)


def count_distinct(parts: list[BatchKeys | None], columns: tuple[str, ...]) -> int | None:
    """The distinct keys of every batch together: their sum when each batch's keys strictly increase
    and the batches' spans do not overlap; else counted over the kept keys (None when not kept)."""
    import pyarrow as pa

    parts = [p for p in parts if p is not None and p.rows]
    if all(p.span is not None for p in parts):
        ordered = sorted(parts, key=lambda p: p.span[0])
        try:
            if all(a.span[1] < b.span[0] for a, b in zip(ordered, ordered[1:])):
                return sum(p.rows for p in parts)
        except TypeError:  # values Python does not order (never proven apart): counted below
            pass
    if any(p.table is None for p in parts):
        return None
    if len(parts) == 1:  # one batch's keys are distinct already
        return parts[0].table.num_rows
    return _distinct_keys(pa.concat_tables([p.table for p in parts]), columns).num_rows if parts else 0


def distinct_in_order(files, columns: tuple[str, ...], footers=None) -> int | None:
    """The distinct keys of local Parquet files whose key columns rise within each row group (no NULL)
    and whose row groups' keys do not overlap, in whichever order the groups were written (writers in
    parallel); None, at the first row group whose order does not prove its keys distinct. Row groups
    are read a few at a time, side by side. `footers`: the files' metadata, where already read."""
    import pyarrow.parquet as pq

    from ..data.footers import each_row_group

    def keys_of(reader, index: int) -> BatchKeys:
        return batch_keys(reader.read_row_group(index, columns=list(columns)), columns, keep=False)

    footers = footers or [pq.read_metadata(str(f)) for f in files]
    parts = []
    groups = each_row_group(files, footers, keys_of)
    try:
        for keys in groups:
            if keys.rows and keys.span is None:
                return None
            parts.append(keys)
    finally:
        groups.close()
    return count_distinct(parts, columns)


def _increasing_span(keys):
    """(first key, last key) when each row's key is greater than the one before (compared column after
    column, as tuples; no NULL), else None."""
    import pyarrow as pa

    n = keys.num_rows
    if n == 0 or any(keys[c].null_count for c in keys.column_names):
        return None
    try:
        if n > 1 and not _rising(keys):
            return None
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):  # a type Arrow does not order
        return None
    first, last = keys.slice(0, 1).to_pylist()[0], keys.slice(n - 1, 1).to_pylist()[0]
    return tuple(first.values()), tuple(last.values())


def _rising(keys) -> bool:
    """Whether each of 2 or more rows' key is greater than the one before: cheap, a comparison of
    neighbours, the first column first (rows out of order in it end the check at once)."""
    import pyarrow as pa

    numbers = (pa.types.is_integer, pa.types.is_timestamp, pa.types.is_date, pa.types.is_time, pa.types.is_duration)
    if all(any(kind(t) for kind in numbers) for t in keys.schema.types):
        return _rising_numbers([keys[c].combine_chunks().to_numpy(zero_copy_only=False) for c in keys.column_names])
    import pyarrow.compute as pc

    n = keys.num_rows
    rising = equal = None
    for name in keys.column_names:
        before, after = keys[name].slice(0, n - 1), keys[name].slice(1)
        greater = pc.greater(after, before)
        if rising is None:
            if not pc.all(pc.greater_equal(after, before)).as_py():
                return False
            rising, equal = greater, pc.equal(after, before)
        else:
            rising, equal = pc.or_(rising, pc.and_(equal, greater)), pc.and_(equal, pc.equal(after, before))
    return bool(pc.all(rising).as_py())


def _rising_numbers(columns: list) -> bool:
    """_rising over numpy arrays of the key's columns (no NULL): numpy compares them in place, without
    the bitmaps Arrow's kernels build for every step."""
    rising = equal = None
    for values in columns:
        before, after = values[:-1], values[1:]
        if rising is None:
            rising = after > before
            equal = after == before
            if not (rising | equal).all():
                return False
        else:
            rising |= equal & (after > before)
            equal &= after == before
    return bool(rising.all())


def _distinct_keys(table, columns: tuple[str, ...]):
    """The distinct values of `columns` in an Arrow table (NULL a value like any other), as a table."""
    return table.select(list(columns)).group_by(list(columns)).aggregate([])


def _measure_of(check: Check, alias: str) -> Measure | None:
    if check.row_level or check.kind == "null_fraction":
        return Measure(alias, "failing", check.columns, _predicate(check))
    if check.kind == "unique":
        return Measure(alias, "distinct", check.columns)
    if check.kind == "freshness":
        return Measure(alias, "max", check.columns)
    return None  # row_count and row_count_change use the row count; python checks are called


FEW_VALUES = 16  # accepted values up to this many are compared one by one, not as an IN list


def _predicate(check: Check):
    """A sqlglot expression, true where a row fails `check` (NULL counts as passing, except in expr)."""
    import sqlglot
    import sqlglot.expressions as exp

    columns = [exp.column(c, quoted=True) for c in check.columns]
    if check.kind in ("not_null", "null_fraction"):
        return exp.or_(*[exp.Is(this=c, expression=exp.Null()) for c in columns])
    if check.kind == "range":
        bounds = []
        if check.args.get("min") is not None:
            bounds.append(exp.LT(this=columns[0], expression=_literal(check.args["min"])))
        if check.args.get("max") is not None:
            bounds.append(exp.GT(this=columns[0], expression=_literal(check.args["max"])))
        return exp.or_(*bounds)
    if check.kind == "accepted_values":
        values = [_literal(v) for v in check.args["values"]]
        if len(values) <= FEW_VALUES:  # same verdict, NULLs included; DuckDB and Polars compare several times faster
            return exp.and_(*[exp.NEQ(this=columns[0], expression=value) for value in values])
        return exp.not_(exp.In(this=columns[0], expressions=values))
    # expr: a row fails unless the expression is true
    return exp.not_(exp.Coalesce(this=exp.paren(sqlglot.parse_one(check.text)), expressions=[exp.false()]))


def _literal(value: Any):
    import sqlglot.expressions as exp

    if isinstance(value, dt.datetime):
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), "TIMESTAMP")
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), "DATE")
    return exp.convert(value)


def _sql_measure(m: Measure, dialect: str) -> str:
    import sqlglot.expressions as exp

    if m.op == "rows":
        return "COUNT(*)"
    if m.op == "failing":
        return f"SUM(CASE WHEN {m.predicate.sql(dialect=dialect)} THEN 1 ELSE 0 END)"
    columns = ", ".join(exp.column(c, quoted=True).sql(dialect=dialect) for c in m.columns)
    if m.op == "max":
        return f"MAX({columns})"
    # distinct keys, a key with NULLs counting as one value: a struct of the columns is never NULL
    return f"COUNT(DISTINCT struct({columns}))" if dialect == "spark" else f"COUNT(DISTINCT row({columns}))"


# --- SQL predicates as Arrow expressions, for engines whose workers hold Arrow or pandas batches ---

def arrow_expression(node):  # noqa: C901 - one branch per SQL construct an expr may use
    import pyarrow as pa
    import pyarrow.compute as pc
    import sqlglot.expressions as exp

    binary = {exp.EQ: "equal", exp.NEQ: "not_equal", exp.GT: "greater", exp.GTE: "greater_equal",
              exp.LT: "less", exp.LTE: "less_equal", exp.Add: "add_checked", exp.Sub: "subtract_checked",
              exp.Mul: "multiply_checked", exp.Div: "divide", exp.And: "and_kleene", exp.Or: "or_kleene",
              exp.Mod: "mod"}
    for kind, function in binary.items():
        if isinstance(node, kind):
            left, right = arrow_expression(node.this), arrow_expression(node.expression)
            if kind is exp.Div:  # SQL divides as a fraction, whatever the columns' types
                left = left.cast(pa.float64())
            return pc.Expression._call(function, [left, right])
    if isinstance(node, exp.Column):
        return pc.field(node.name)
    if isinstance(node, exp.Paren):
        return arrow_expression(node.this)
    if isinstance(node, exp.Not):
        return pc.invert(arrow_expression(node.this))
    if isinstance(node, exp.Neg):
        return pc.negate(arrow_expression(node.this))
    if isinstance(node, exp.Is):  # IS NULL, IS TRUE, IS FALSE: never NULL themselves
        value = arrow_expression(node.this)
        if isinstance(node.expression, exp.Null):
            return pc.is_null(value)
        if isinstance(node.expression, exp.Boolean):
            return pc.Expression._call("coalesce", [pc.equal(value, pc.scalar(node.expression.this)),
                                                    pc.scalar(False)])
        return _unsupported(node)
    if isinstance(node, exp.Between):
        if node.args.get("symmetric"):
            return _unsupported(node)
        value = arrow_expression(node.this)
        return pc.and_kleene(pc.greater_equal(value, arrow_expression(node.args["low"])),
                             pc.less_equal(value, arrow_expression(node.args["high"])))
    if isinstance(node, exp.In):  # NULL IN (...) is NULL, as in SQL (isin alone says False)
        if not isinstance(node.this, exp.Column):
            return _unsupported(node)
        value, unknown = pc.field(node.this.name), pc.scalar(pa.scalar(None, pa.bool_()))
        listed = [v for v in node.expressions if not isinstance(v, exp.Null)]
        found = value.isin([_python_value(v) for v in listed])
        if len(listed) < len(node.expressions):  # a NULL in the list: a value not found is NULL, not FALSE
            found = pc.Expression._call("if_else", [found, pc.scalar(True), unknown])
        return pc.Expression._call("if_else", [pc.is_null(value), unknown, found])
    if isinstance(node, exp.Coalesce):
        return pc.coalesce(*[arrow_expression(n) for n in [node.this, *node.expressions]])
    if isinstance(node, (exp.Literal, exp.Boolean, exp.Null, exp.Cast)):
        return pc.scalar(_python_value(node))
    return _unsupported(node)


def _python_value(node) -> Any:
    import sqlglot.expressions as exp

    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return node.this
    if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal):
        text = node.this.this
        is_date = node.to.this == exp.DataType.Type.DATE
        return dt.date.fromisoformat(text) if is_date else dt.datetime.fromisoformat(text)
    if isinstance(node, exp.Literal):
        return node.this if node.is_string else (int(node.this) if node.this.lstrip("-").isdigit()
                                                 else float(node.this))
    return _unsupported(node)


def _unsupported(node):
    from ..errors import ConfigError

    raise ConfigError(f"this engine checks expr row by row in Arrow, which cannot evaluate "
                      f"'{node.sql()}' (use comparisons, AND/OR/NOT, BETWEEN, IN, IS NULL and arithmetic)")


# --- judging measured values ---

@dataclass
class Outcome:
    """What one check found: status passed | warned | failed | dropped; `failing` rows (when the check
    counts rows); `value` what it measured (a fraction, a row count, a change, the newest value);
    `partition` the partition it judged ('week=2026-11-23'), None when it judged the whole dataset."""

    dataset: str
    check: str
    kind: str
    on_fail: str
    status: str
    failing: int | None = None
    value: Any = None
    detail: str = ""
    examples: list[dict[str, Any]] = field(default_factory=list)
    partition: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def record(self) -> dict[str, Any]:
        """As run records, manifests and notifications keep it (JSON)."""
        record = {"check": self.check, "kind": self.kind, "on_fail": self.on_fail, "status": self.status,
                  "failing": self.failing, "value": _jsonable(self.value), "detail": self.detail}
        return record | ({"partition": self.partition} if self.partition is not None else {})

    def line(self) -> str:
        where = f", partition {self.partition}" if self.partition is not None else ""
        shown = "; ".join(", ".join(f"{k}={_quoted(v)}" for k, v in row.items()) for row in self.examples)
        return (f"dataset '{self.dataset}'{where}: check '{self.check}' ({self.kind}) failed: {self.detail}"
                + (f" (e.g. {shown})" if shown else ""))


@dataclass(frozen=True)
class Published:
    """The row counts of the version published now, which row_count_change compares with: the whole
    dataset's, and each partition's (a partitioned dataset's manifest records them)."""

    rows: int | None = None
    partitions: dict[str, int] | None = None

    def of(self, partition: str | None) -> tuple[int | None, str]:
        """(the count a check of `partition` compares with, what it is in words). A partition not
        published yet is compared with the median partition: a new week is about as big as a usual one."""
        if partition is None:
            return self.rows, "published"
        if not self.partitions:
            return None, "published"
        if partition in self.partitions:
            return self.partitions[partition], f"published in {partition}"
        counts = sorted(self.partitions.values())
        middle = len(counts) // 2
        median = counts[middle] if len(counts) % 2 else (counts[middle - 1] + counts[middle]) // 2
        return median, f"in the median published partition (of {len(counts)}; {partition} is new)"


def judge(dataset: str, check: Check, values: dict[str, Any], plan: CheckPlan, published: Published | None = None,
          now: dt.datetime | None = None, partition: str | None = None) -> Outcome:
    """The outcome of one measured check (python checks are judged from what their function returned),
    over the whole dataset or one `partition` of it."""
    rows = values[ROWS]
    measured = values.get(plan.alias.get(check.name))
    previous = (published or Published()).of(partition)
    failed, failing, value, detail = _verdict(check, rows, measured, previous, now or _utcnow())
    status = "passed" if not failed else {"error": "failed", "warn": "warned", "drop": "dropped"}[check.on_fail]
    return Outcome(dataset, check.name, check.kind, check.on_fail, status, failing, value, detail, partition=partition)


def _verdict(check: Check, rows: int, measured: Any, previous: tuple[int | None, str],  # noqa: C901 - one rule per kind
             now: dt.datetime) -> tuple[bool, int | None, Any, str]:
    """(failed, failing rows, measured value, what was found in words)."""
    args = check.args
    if check.row_level:
        return measured > 0, measured, measured, f"{measured:,} of {rows:,} rows fail"
    if check.kind == "unique":
        duplicates = rows - measured
        return duplicates > 0, duplicates, duplicates, f"{duplicates:,} of {rows:,} rows repeat a key " \
                                                      f"({', '.join(check.columns)})"
    if check.kind == "null_fraction":
        fraction = measured / rows if rows else 0.0
        return fraction > args["max"], measured, round(fraction, 6), \
            f"{fraction:.1%} of {rows:,} rows have no {check.columns[0]} (at most {args['max']:.1%})"
    if check.kind == "row_count":
        low, high = args.get("min"), args.get("max")
        failed = (low is not None and rows < low) or (high is not None and rows > high)
        return failed, None, rows, f"{rows:,} rows (expected {_bounds(low, high)})"
    if check.kind == "row_count_change":
        return _change(rows, previous, args)
    if check.kind == "freshness":
        return _freshness(check, measured, now)
    raise AssertionError(check.kind)


def _bounds(low, high) -> str:
    return " and ".join(part for part in (f"at least {low:,}" if low is not None else "",
                                          f"at most {high:,}" if high is not None else "") if part)


def _change(rows: int, against: tuple[int | None, str], args: dict) -> tuple[bool, None, Any, str]:
    previous, what = against
    if previous is None:
        return False, None, None, f"{rows:,} rows; no published count to compare with"
    ratio = rows / previous if previous else (float("inf") if rows else 1.0)
    drop, growth = args.get("max_drop"), args.get("max_growth")
    failed = (drop is not None and ratio < 1 - drop) or (growth is not None and ratio > growth)
    return failed, None, {"rows": rows, "previous": previous, "ratio": round(ratio, 4)}, \
        f"{rows:,} rows against {previous:,} {what} ({ratio:.2f}x; allowed {_allowed(drop, growth)})"


def _allowed(drop, growth) -> str:
    parts = ([f"at least {1 - drop:.2f}x"] if drop is not None else []) + \
        ([f"at most {growth:.2f}x"] if growth is not None else [])
    return " and ".join(parts)


def _freshness(check: Check, newest: Any, now: dt.datetime) -> tuple[bool, None, Any, str]:
    max_age = parse_duration(check.args["max_age"])
    column = check.columns[0]
    if newest is None:
        return True, None, None, f"{column} has no value"
    moment = newest if isinstance(newest, dt.datetime) else dt.datetime.combine(newest, dt.time())
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)  # naive timestamps are taken as UTC
    age = (now - moment).total_seconds()
    return age > max_age, None, moment.isoformat(), \
        f"the newest {column} is {_age(age)} old ({moment.isoformat()}; at most {_age(max_age)})"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def python_outcome(dataset: str, check: Check, returned: Any, count_rows) -> Outcome:
    """A python check's outcome from what its function returned: a count of failing rows, a bool
    (True: passed), or a frame of failing rows (`count_rows` counts it, by its engine)."""
    returned = _plain(returned)
    if isinstance(returned, bool):
        failing, failed = None, not returned
        detail = "the check returned False"
    elif isinstance(returned, int):
        failing, failed = returned, returned > 0
        detail = f"{returned:,} rows fail"
    else:
        failing = int(count_rows(returned))
        failed, detail = failing > 0, f"{failing:,} rows fail"
    status = "passed" if not failed else {"error": "failed", "warn": "warned", "drop": "dropped"}[check.on_fail]
    return Outcome(dataset, check.name, check.kind, check.on_fail, status, failing, failing, detail)


def _plain(value: Any) -> Any:
    """A lazy scalar (Dask's) computed, and a numpy scalar (a pandas sum, an all()) as the Python
    bool or int it holds; anything else as it is."""
    if type(value).__name__ == "Scalar" and hasattr(value, "compute"):
        value = value.compute()
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _quoted(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "…"


def _jsonable(value: Any) -> Any:
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value
