"""Data checks declared on a dataset (`checks:`): their shapes, read into Check objects, and what
`validate` says about them. Pure Python and sqlglot: validate imports no engine, pyarrow or pandas.

Each entry of `checks:` is a mapping with one kind key (`not_null: [a, b]`, `range: {...}`, ...)
and optionally `on_fail` (error | warn | drop) and `name`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..diagnostics import did_you_mean

ON_FAIL = ("error", "warn", "drop")
PYTHON_CHECK = "python"  # the kind of check that calls a function (on the engine's frame); not an engine's name
# row-level: each row passes or fails on its own, so failing rows can be dropped
ROW_LEVEL = ("not_null", "range", "accepted_values", "expr")
AGGREGATE = ("unique", "row_count", "row_count_change", "null_fraction", "freshness", PYTHON_CHECK)
KINDS = ROW_LEVEL + AGGREGATE
# the keys of each kind's mapping (kinds given a list or a string take no mapping)
_KEYS = {
    "range": ({"column"}, {"min", "max"}),
    "accepted_values": ({"column", "values"}, set()),
    "row_count": (set(), {"min", "max"}),
    "row_count_change": (set(), {"max_drop", "max_growth"}),
    "null_fraction": ({"column", "max"}, set()),
    "freshness": ({"column", "max_age"}, set()),
}
_COLUMNS_KINDS = ("not_null", "unique")  # a column name or a list of them
_TEXT_KINDS = ("expr", PYTHON_CHECK)
REJECTED_SUFFIX = "_rejected"
CHECK_COLUMN = "check"  # the column of a quarantine dataset naming the check a row failed
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Check:
    """One declared check, read from its entry: `index` is its place in the dataset's list."""

    kind: str
    name: str
    on_fail: str
    index: int
    columns: tuple[str, ...] = ()
    args: dict[str, Any] = field(default_factory=dict)  # min, max, values, max_drop, max_growth, max_age
    text: str | None = None  # an expr's SQL, a python check's module:function

    @property
    def row_level(self) -> bool:
        return self.kind in ROW_LEVEL


@dataclass(frozen=True)
class CheckProblem:
    """Where in the entry (a path below the entry, e.g. ('range', 'column')) and what."""

    path: tuple
    message: str
    at_key: bool = False


def read_checks(entries: list[Any], dataset: str) -> tuple[list[Check], list[tuple[int, CheckProblem]]]:
    """The checks of `dataset` from its `checks:` entries, and each problem with its entry's index."""
    checks, problems = [], []
    for index, entry in enumerate(entries or []):
        check, found = read_check(entry, index, dataset)
        problems += [(index, p) for p in found]
        if check is not None:
            checks.append(check)
    seen: dict[str, int] = {}
    for check in checks:
        if check.name in seen:
            problems.append((check.index, CheckProblem(
                (), f"dataset '{dataset}' has two checks named '{check.name}' (entries {seen[check.name] + 1} and "
                    f"{check.index + 1}): give one a different name:")))
        seen.setdefault(check.name, check.index)
    return checks, problems


def read_check(entry: Any, index: int, dataset: str) -> tuple[Check | None, list[CheckProblem]]:
    if not isinstance(entry, dict):
        return None, [CheckProblem((), f"check {index + 1} of dataset '{dataset}' must be a mapping with one kind "
                                       f"key, e.g. '- not_null: [id]' (kinds: {', '.join(KINDS)})")]
    kinds = [k for k in entry if k not in ("on_fail", "name")]
    if len(kinds) != 1:
        if not kinds:
            return None, [CheckProblem((), f"check {index + 1} of dataset '{dataset}' names no kind (one of "
                                           f"{', '.join(KINDS)})")]
        known = [k for k in kinds if k in KINDS]
        unknown = next((k for k in kinds if k not in KINDS), None)
        if unknown is not None:
            return None, [_unknown_kind(unknown)]
        return None, [CheckProblem((known[1],), f"one check per list entry: '{known[0]}' and '{known[1]}' are "
                                                "two checks (start each with '- ')", at_key=True)]
    kind = kinds[0]
    if kind not in KINDS:
        return None, [_unknown_kind(kind)]
    problems: list[CheckProblem] = []
    on_fail = entry.get("on_fail", "error")
    if on_fail not in ON_FAIL:
        problems.append(CheckProblem(("on_fail",), f"on_fail must be one of {', '.join(ON_FAIL)}, not "
                                                   f"'{on_fail}'{did_you_mean(str(on_fail), ON_FAIL)}"))
        on_fail = "error"
    if on_fail == "drop" and kind not in ROW_LEVEL:
        problems.append(CheckProblem(("on_fail",), f"on_fail: drop needs a row-level check ({', '.join(ROW_LEVEL)}); "
                                                   f"'{kind}' judges the whole dataset: use error or warn"))
    body, found = _body(kind, entry[kind])
    problems += found
    name = entry.get("name")
    if name is not None and not (isinstance(name, str) and _NAME.match(name)):
        problems.append(CheckProblem(("name",), f"check name '{name}' must be a plain identifier "
                                                "(letters, digits and _)"))
        name = None
    if body is None:
        return None, problems
    columns, args, text = body
    return Check(kind, name or default_name(kind, columns, text, index), on_fail, index, columns, args, text), problems


def _unknown_kind(kind: str) -> CheckProblem:
    return CheckProblem((kind,), f"unknown check kind '{kind}'{did_you_mean(kind, KINDS)} (kinds: {', '.join(KINDS)})",
                        at_key=True)


def default_name(kind: str, columns: tuple[str, ...], text: str | None, index: int) -> str:
    if kind == PYTHON_CHECK and text:
        return "python_" + text.rsplit(":", 1)[-1]
    if columns:
        return kind + "_" + "_".join(re.sub(r"\W", "_", c) for c in columns)
    return kind if kind in ("row_count", "row_count_change") else f"{kind}_{index + 1}"


def _body(kind: str, value: Any) -> tuple[tuple | None, list[CheckProblem]]:
    """(columns, args, text) of one kind's value, or None and why not."""
    if kind in _COLUMNS_KINDS:
        columns = [value] if isinstance(value, str) else value
        if not isinstance(columns, list) or not columns or not all(isinstance(c, str) and c for c in columns):
            return None, [CheckProblem((kind,), f"{kind} takes a column or a list of columns, e.g. {kind}: [id]")]
        return (tuple(columns), {}, None), []
    if kind in _TEXT_KINDS:
        if not isinstance(value, str) or not value.strip():
            example = '"amount >= 0"' if kind == "expr" else "stages.checks:no_future_weeks"
            return None, [CheckProblem((kind,), f"{kind} takes a string, e.g. {kind}: {example}")]
        return ((), {}, value.strip()), []
    required, optional = _KEYS[kind]
    if not isinstance(value, dict):
        return None, [CheckProblem((kind,), f"{kind} takes a mapping with {', '.join(sorted(required | optional))}")]
    problems = [CheckProblem((kind, key), f"{kind} has no key '{key}'{did_you_mean(key, required | optional)} "
                                          f"(keys: {', '.join(sorted(required | optional))})", at_key=True)
                for key in value if key not in required | optional]
    missing = sorted(required - set(value))
    if missing:
        problems.append(CheckProblem((kind,), f"{kind} needs {', '.join(missing)}"))
    if kind in ("range", "row_count") and not (set(value) & {"min", "max"}):
        problems.append(CheckProblem((kind,), f"{kind} needs min, max or both"))
    problems += _argument_problems(kind, value)
    if problems:
        return None, problems
    column = value.get("column")
    args = {k: v for k, v in value.items() if k != "column"}
    return ((column,) if column else (), args, None), []


def _argument_problems(kind: str, value: dict) -> list[CheckProblem]:  # noqa: C901 - one rule per key
    from .model import parse_duration

    problems = []
    for key in ("min", "max", "max_drop", "max_growth"):
        if key in value and (isinstance(value[key], bool) or not _is_number_or_time(value[key], kind)):
            problems.append(CheckProblem((kind, key), f"{kind}.{key} must be a number"))
    if "column" in value and not (isinstance(value["column"], str) and value["column"]):
        problems.append(CheckProblem((kind, "column"), f"{kind}.column must be a column name"))
    if kind == "null_fraction" and _is_number(value.get("max")) and not 0 <= value["max"] <= 1:
        problems.append(CheckProblem((kind, "max"), "null_fraction.max is a fraction between 0 and 1"))
    if kind == "row_count_change":
        if _is_number(value.get("max_drop")) and not 0 <= value["max_drop"] <= 1:
            problems.append(CheckProblem((kind, "max_drop"), "max_drop is a fraction between 0 and 1 (0.5: at most "
                                                             "half the rows may go)"))
        if _is_number(value.get("max_growth")) and value["max_growth"] < 1:
            problems.append(CheckProblem((kind, "max_growth"), "max_growth is a ratio of at least 1 (3.0: at most "
                                                               "three times the rows)"))
        if not value:
            problems.append(CheckProblem((kind,), "row_count_change needs max_drop, max_growth or both"))
    if kind == "accepted_values" and "values" in value and not (isinstance(value["values"], list) and value["values"]):
        problems.append(CheckProblem((kind, "values"), "accepted_values.values is a list of values"))
    elif kind == "accepted_values" and isinstance(value.get("values"), list) and None in value["values"]:
        # in SQL, x NOT IN (.., NULL) is never true: the check could then fail no row at all
        problems.append(CheckProblem((kind, "values"), "accepted_values.values cannot hold null: a NULL in the "
                                                       "column passes accepted_values already (add not_null to "
                                                       "refuse it)"))
    if kind == "freshness" and "max_age" in value:
        try:
            parse_duration(value["max_age"])
        except ValueError as exc:
            problems.append(CheckProblem((kind, "max_age"), f"freshness.max_age: {exc}"))
    return problems


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_number_or_time(value: Any, kind: str) -> bool:
    """range bounds may be dates or timestamps too (YAML reads 2026-01-01 as a date)."""
    import datetime

    return _is_number(value) or (kind == "range" and isinstance(value, (datetime.date, str)))


def expr_problem(text: str) -> str | None:
    """Why an expr is not one SQL boolean over a row (sqlglot reads it, as validate does)."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(text)
    except sqlglot.errors.ParseError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "syntax error"
        return f"expr does not parse as SQL: {first}"
    if tree is None or isinstance(tree, (exp.Query, exp.Command)) or tree.find(exp.Select):
        return "expr must be a boolean expression over one row (e.g. amount >= 0), not a query"
    if tree.find(exp.AggFunc):
        return "expr is checked row by row: it cannot use an aggregate function"
    return None


def expr_columns(text: str) -> list[str]:
    """The columns an expr reads."""
    import sqlglot
    from sqlglot import exp

    return sorted({c.name for c in sqlglot.parse_one(text).find_all(exp.Column)})


def rejected_name(dataset: str) -> str:
    return dataset + REJECTED_SUFFIX


def quarantine_of(pipeline, name: str) -> str | None:
    """The produced dataset whose dropped rows `name` holds (`<dataset>_rejected`), or None."""
    source = name.removesuffix(REJECTED_SUFFIX)
    return source if name != source and source in pipeline.dag.producer else None


def pipeline_problems(p) -> list:
    """validate's problems with every dataset's checks (a definition.pipeline.Pipeline), each at its place."""
    problems = []
    for name, ds in p.spec.datasets.items():
        at = ("datasets", name, "checks")
        checks, found = read_checks(ds.checks, name)
        problems += [p.source.problem(at + (index,) + problem.path, f"dataset '{name}': {problem.message}",
                                      at_key=problem.at_key) for index, problem in found]
        for check in checks:
            problems += [p.source.problem(at + (check.index,) + path, f"dataset '{name}', check '{check.name}': "
                                          f"{message}") for path, message in _check_problems(p, name, ds, check)]
        if checks and ds.kind != "table":
            problems.append(p.source.problem(at, f"dataset '{name}' is kind: {ds.kind}: checks judge the rows of a "
                                             "table; check its files in the stage that writes them", at_key=True))
        if p.is_external(name):
            problems += [p.source.problem(at + (c.index, "on_fail"), f"dataset '{name}', check '{c.name}': on_fail: "
                                          "drop removes rows from what a stage writes, not from an external input; "
                                          "use error or warn here, or drop in the stage that reads it")
                         for c in checks if c.on_fail == "drop"]
        if checks and rejected_name(name) in set(p.spec.datasets) | set(p.dag.producer) and \
                any(c.on_fail == "drop" for c in checks):
            problems.append(p.source.problem(at, f"dataset '{name}' drops rows into '{rejected_name(name)}', which "
                                             "is already a dataset of the pipeline: rename that one", at_key=True))
    return problems


def _check_problems(p, name: str, ds, check: Check) -> list[tuple[tuple, str]]:
    where = (check.kind,)
    if check.kind == "expr":
        why = expr_problem(check.text)
        if why:
            return [(where, why)]
        columns = expr_columns(check.text)
    elif check.kind == PYTHON_CHECK:
        return _python_problems(p, check)
    else:
        columns = list(check.columns)
        if check.kind in _KEYS and "column" in _KEYS[check.kind][0]:
            where = (check.kind, "column")
    if ds.schema_ is None:
        return []
    return [(where, f"column '{c}' is not in the declared schema{did_you_mean(c, ds.schema_)}")
            for c in columns if c not in ds.schema_]


def _python_problems(p, check: Check) -> list[tuple[tuple, str]]:
    from .model import RUN_TARGET
    from .stagecode import inspect_target

    if not RUN_TARGET.match(check.text):
        return [((PYTHON_CHECK,), f"'{check.text}' is not a module:function reference (e.g. stages.checks:no_dupes)")]
    if not p.root.is_dir():
        return []
    target = inspect_target(p.root, check.text)
    return [((PYTHON_CHECK,), target.error)] if target.error else []


def dataset_checks(pipeline, dataset: str) -> list[Check]:
    """A dataset's checks as a run uses them (validate reported any problem before)."""
    return read_checks(pipeline.dataset(dataset).checks, dataset)[0]
