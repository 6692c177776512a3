"""What a table's Parquet files answer of its checks (their footers' counts and bounds, a key's order)
is what the engine would have measured, and only the rest reaches the engine."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow import backends
from hybridflow.backends.checkplan import CheckPlan
from hybridflow.data.tables import TableSource, parquet_files
from hybridflow.definition.datachecks import read_checks
from hybridflow.execution.filechecks import answered, measure

CHECKS = [
    {"not_null": ["customer_id", "week"]},
    {"not_null": ["device", "events"], "name": "two_with_nulls"},
    {"unique": ["customer_id", "week"]},
    {"range": {"column": "events", "min": 0, "max": 1000}},
    {"accepted_values": {"column": "plan", "values": ["free", "pro", "team"]}},
    {"row_count": {"min": 1}},
    {"null_fraction": {"column": "device", "max": 0.5}},
    {"expr": "active_days BETWEEN 0 AND 127 AND NOT week > 3", "name": "bitmask"},
    {"expr": "events >= -1 OR device IS NULL", "name": "either"},
    {"freshness": {"column": "event_time", "max_age": "8d"}},
]


class Engine:
    """The python engine, its measures noted: which of them the files left to it."""

    def __init__(self, log_dir) -> None:
        self.backend = backends.create("python", None, log_dir)
        self.asked: list[list[str]] = []
        self.hashed: list[str] = []

    def check_frame(self, source):
        return self.backend.check_frame(source)

    def check_measure(self, frame, plan):
        self.asked.append([m.alias for m in plan.measures])
        self.hashed += [m.alias for m in plan.measures if m.hashed]
        return self.backend.check_measure(frame, plan)


def written(tmp_path, tables: list[pa.Table], group_rows: int) -> TableSource:
    directory = tmp_path / "out"
    directory.mkdir()
    for number, table in enumerate(tables):
        pq.write_table(table, directory / f"part-{number}.parquet", row_group_size=group_rows)
    return TableSource("out", (directory,), "parquet", tables[0].schema, (), directory)


def weeks(rng, rows: int, start: int = 0, shuffled: bool = False, bad: float = 0.0, nulls: float = 0.0) -> pa.Table:
    order = np.arange(start, start + rows)
    if shuffled:
        order = rng.permutation(order)
    planted = rng.random(rows) < bad
    moment = dt.datetime(2026, 11, 20, tzinfo=dt.timezone.utc)
    return pa.table({
        "customer_id": order // 4,
        "week": (order % 4).astype(np.int32),
        "events": pa.array(np.where(planted, 5000, rng.integers(0, 1000, rows)), mask=rng.random(rows) < nulls),
        "plan": pa.array(rng.choice(["free", "pro", "team"], rows)),
        "device": pa.array(rng.choice(["ios", "web"], rows), mask=rng.random(rows) < max(nulls, 0.1)),
        "active_days": np.where(planted, 200, rng.integers(0, 128, rows)),
        "event_time": pa.array([moment + dt.timedelta(seconds=int(s)) for s in rng.integers(0, 86400, rows)],
                               pa.timestamp("us", "UTC")),
    })


@pytest.fixture
def plan():
    checks, problems = read_checks(CHECKS, "out")
    assert not problems
    return CheckPlan(checks)


def test_clean_rows_leave_the_engine_only_what_footers_cannot_bound(tmp_path, plan):
    rng = np.random.default_rng(1)
    source = written(tmp_path, [weeks(rng, 400), weeks(rng, 400, start=400)], group_rows=100)
    engine = Engine(tmp_path)
    values = measure(engine, source, plan)
    assert values == engine.backend.check_measure(engine.backend.check_frame(source), plan)
    # bounds, NULL counts, the key's order and the plan column's dictionary answer every measure
    assert engine.asked == []
    assert values[plan.alias["unique_customer_id_week"]] == 800


def test_planted_bad_rows_and_nulls_are_counted_by_the_engine_where_the_footers_cannot_tell(tmp_path, plan):
    rng = np.random.default_rng(2)
    source = written(tmp_path, [weeks(rng, 300, bad=0.01, nulls=0.05)], group_rows=100)
    engine = Engine(tmp_path)
    values = measure(engine, source, plan)
    assert values == engine.backend.check_measure(engine.backend.check_frame(source), plan)
    assert values[plan.alias["range_events"]] > 0 and values[plan.alias["bitmask"]] > 0
    left = set(engine.asked[0])
    # out of range, NULLs in two columns of one row group: the engine counts those rows
    assert {plan.alias["range_events"], plan.alias["bitmask"], plan.alias["two_with_nulls"]} <= left
    # one column's NULLs are its footers' count; a key in order is distinct
    assert plan.alias["null_fraction_device"] not in left and plan.alias["unique_customer_id_week"] not in left


def test_keys_out_of_order_are_hashed_by_the_engine_without_a_second_order_proof(tmp_path, plan):
    rng = np.random.default_rng(3)
    source = written(tmp_path, [weeks(rng, 300, shuffled=True)], group_rows=100)
    engine = Engine(tmp_path)
    values = measure(engine, source, plan)
    assert values[plan.alias["unique_customer_id_week"]] == 300
    assert engine.hashed == [plan.alias["unique_customer_id_week"]]


@pytest.mark.parametrize("seed", range(30))
def test_whatever_the_rows_the_files_and_the_engine_measure_the_same(tmp_path, plan, seed):
    rng = np.random.default_rng(seed)
    parts = [weeks(rng, int(rng.integers(0, 120)), start=i * 200, shuffled=bool(rng.random() < 0.3),
                   bad=float(rng.choice([0, 0.02])), nulls=float(rng.choice([0, 0.03]))) for i in range(3)]
    source = written(tmp_path, parts, group_rows=int(rng.integers(10, 60)))
    engine = Engine(tmp_path)
    assert measure(engine, source, plan) == engine.backend.check_measure(engine.backend.check_frame(source), plan)


@pytest.mark.parametrize("values", [[3, 7, 5], [5, 5], [5, None], [None, None]], ids=["3..7", "only 5", "5 and NULL",
                                                                                      "NULL only"])
def test_comparisons_at_a_row_groups_bounds_count_as_the_engine_does(tmp_path, values):
    table = pa.table({"n": pa.array(values, pa.int64()), "m": pa.array([-1] * len(values), pa.int16())})
    source = written(tmp_path, [table], group_rows=len(values))
    entries = [{"expr": f"{left} {op} {right}", "name": f"e{i}_{j}_{k}"}
               for i, op in enumerate([">", ">=", "<", "<=", "=", "<>"])
               for j, number in enumerate([2, 3, 5, 7, 8, -3])
               for k, (left, right) in enumerate([("n", number), (number, "n"), ("m", f"-{abs(number)}")])]
    entries += [{"range": {"column": "n", **bounds}, "name": f"r{i}"}
                for i, bounds in enumerate([{"min": 3, "max": 7}, {"min": 4, "max": 7}, {"min": 3, "max": 6},
                                            {"min": 5, "max": 5}, {"min": 8}, {"max": 2}])]
    checks, problems = read_checks(entries, "out")
    assert not problems
    plan = CheckPlan(checks)
    engine = Engine(tmp_path)
    assert measure(engine, source, plan) == engine.backend.check_measure(engine.backend.check_frame(source), plan)


@pytest.mark.parametrize("expression", ["x >= 0 OR nosuch > 5", "x >= 0 OR plan > 5", "x >= 0 OR plan",
                                        "plan > 5", "upper(plan) = 'A'",
                                        "NOT (x BETWEEN SYMMETRIC 4 AND 1)", "ratio IS NOT NULL",
                                        "x >= 0 OR NOT x", "x >= 0 OR upper(plan) = 'A'", "x < y"])
def test_what_an_engine_would_judge_differently_or_refuse_is_left_to_it(tmp_path, expression):
    """A column the files lack, a string compared with a number, a value where a condition belongs,
    SYMMETRIC, a floating column's NULLs (NaN is NULL to pandas), a function, two columns: the files
    answer none of them, even where the rest of the expression would settle it."""
    table = pa.table({"x": pa.array([2, 3], pa.int64()), "y": pa.array([1, 1], pa.int64()),
                      "plan": ["a", "b"], "ratio": pa.array([1.0, float("nan")])})
    source = written(tmp_path, [table], group_rows=2)
    checks, problems = read_checks([{"expr": expression, "name": "e"}], "out")
    assert not problems
    plan = CheckPlan(checks)
    known, rest = answered(plan, parquet_files(source))
    assert plan.alias["e"] not in known and plan.alias["e"] in [m.alias for m in rest.measures]


def test_a_decimal_literal_is_compared_exactly_not_as_a_binary_float(tmp_path):
    table = pa.table({"n": pa.array([2**53 + 1], pa.int64())})
    source = written(tmp_path, [table], group_rows=1)
    checks, _ = read_checks([{"expr": "n = 9007199254740993.0", "name": "exact"},
                             {"expr": "n > 9007199254740992.5", "name": "above"}], "out")
    plan = CheckPlan(checks)
    known, _ = answered(plan, parquet_files(source))
    assert known[plan.alias["exact"]] == 0 and known[plan.alias["above"]] == 0  # true on its one row: none fail


@pytest.mark.parametrize("dictionary", [True, False], ids=["dictionary", "plain"])
@pytest.mark.parametrize("entry", [
    {"accepted_values": {"column": "plan", "values": ["free", "pro"]}},
    {"accepted_values": {"column": "plan", "values": [f"v{i}" for i in range(20)] + ["team"]}},
    {"expr": "plan <> 'pro'"},
    {"expr": "plan IS NULL OR plan IN ('free', 'team')"},
    {"expr": "NOT plan = 'team'"},
    {"expr": "plan > 'm'"},
], ids=["accepted", "accepted_many", "neq", "null_or_in", "not", "greater"])
def test_a_one_column_check_is_counted_from_its_dictionary_as_the_engine_counts_it(tmp_path, entry, dictionary):
    """Strings with NULLs in row groups of their own dictionaries: counted value by value where the
    column is dictionary-encoded, left to the engine where it is not."""
    rng = np.random.default_rng(11)
    rows = 500
    table = pa.table({"plan": pa.array(rng.choice(["free", "pro", "team", "zeta"], rows), mask=rng.random(rows) < 0.1)})
    directory = tmp_path / "out"
    directory.mkdir()
    pq.write_table(table, directory / "part-0.parquet", row_group_size=128, use_dictionary=dictionary)
    source = TableSource("out", (directory,), "parquet", table.schema, (), directory)
    checks, problems = read_checks([{**entry, "name": "c"}], "out")
    assert not problems
    plan = CheckPlan(checks)
    engine = Engine(tmp_path)
    values = measure(engine, source, plan)
    assert values == engine.backend.check_measure(engine.backend.check_frame(source), plan)
    assert values[plan.alias["c"]] > 0
    asked = [alias for measures in engine.asked for alias in measures]
    assert (plan.alias["c"] in asked) == (not dictionary)
