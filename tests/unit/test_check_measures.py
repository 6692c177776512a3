"""Checks measured on Arrow (how the python, Dask and Ray engines measure them) agree with SQL's
rules: NULL passes accepted_values and range, `IS TRUE` means true, and a python check may return a
numpy scalar as pandas gives it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from hybridflow.backends.checkplan import CheckPlan, judge, python_outcome
from hybridflow.definition.datachecks import read_checks

TABLE = pa.table({"plan": ["free", None, "gold", "pro"], "active": [True, None, False, True],
                  "events": [1, None, 5, 200]})


def outcomes(*entries) -> dict[str, tuple[str, int | None]]:
    checks, problems = read_checks(list(entries), "weeks")
    assert not problems
    plan = CheckPlan(checks)
    values = plan.combine([plan.arrow_partials(TABLE)])
    return {c.name: (o.status, o.failing) for c in checks for o in [judge("weeks", c, values, plan, None)]}


def test_null_passes_accepted_values_and_range_as_in_sql():
    found = outcomes({"accepted_values": {"column": "plan", "values": ["free", "pro", "team"]}},
                     {"range": {"column": "events", "min": 0, "max": 100}})
    assert found == {"accepted_values_plan": ("failed", 1), "range_events": ("failed", 1)}  # gold; 200


@pytest.mark.parametrize("extra", [0, 40], ids=["compared one by one", "as an IN list"])
def test_accepted_values_give_one_verdict_however_many_values_are_listed(extra):
    padding = [f"unused-{i}" for i in range(extra)]  # past FEW_VALUES: an IN list
    found = outcomes({"accepted_values": {"column": "plan", "values": ["free", "pro", *padding]}})
    assert found == {"accepted_values_plan": ("failed", 1)}  # gold; NULL passes


def test_an_expr_is_true_only_where_sql_says_so():
    found = outcomes({"expr": "active IS TRUE", "name": "is_true"}, {"expr": "active IS FALSE", "name": "is_false"},
                     {"expr": "plan NOT IN ('gold')", "name": "not_gold"})
    # a row fails unless the expression is true: NULL fails an expr
    assert found == {"is_true": ("failed", 2), "is_false": ("failed", 3), "not_gold": ("failed", 2)}


@pytest.mark.parametrize(("returned", "status", "failing"), [
    (np.int64(0), "passed", 0), (np.int64(3), "failed", 3), (np.bool_(True), "passed", None),
    (np.bool_(False), "failed", None), (2.0, "failed", 2)])
def test_a_python_check_may_return_a_numpy_scalar(returned, status, failing):
    [check], _ = read_checks([{"python": "stages.checks:anything"}], "weeks")
    outcome = python_outcome("weeks", check, returned, count_rows=len)
    assert (outcome.status, outcome.failing) == (status, failing)


@pytest.mark.parametrize("condition", ["plan IN ('free', 'pro')", "plan NOT IN ('free', 'pro')",
                                       "plan IN ('free', NULL)", "plan NOT IN ('free', NULL)",
                                       "NOT (plan IN ('gold') OR plan IS NULL)", "plan <> 'pro' AND plan > 'f'"])
def test_an_expr_fails_the_rows_sqlite_fails(condition):
    """SQL's three-valued logic, NULL in an IN list included, against an independent SQL engine."""
    import sqlite3

    with sqlite3.connect(":memory:") as db:
        db.execute("CREATE TABLE t (plan TEXT)")
        db.executemany("INSERT INTO t VALUES (?)", [(p,) for p in TABLE["plan"].to_pylist()])
        [(expected,)] = db.execute(f"SELECT COUNT(*) FROM t WHERE NOT COALESCE(({condition}), FALSE)").fetchall()
    assert outcomes({"expr": condition, "name": "e"})["e"][1] == expected
