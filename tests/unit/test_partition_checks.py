"""Checks of a partitioned output, as measured on Arrow batches (the python engine, Dask's and Ray's
workers): each partition's measures in one pass, named as incremental stages name partitions, and what
row_count_change compares a partition with."""

from __future__ import annotations

import datetime as dt
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq

from hybridflow.backends.checkplan import ROWS, CheckPlan, Published, judge, partition_name
from hybridflow.definition.datachecks import read_checks
from hybridflow.execution.datachecking import carried_checks
from hybridflow.store.catalog import partition_rows, read_footer
from hybridflow.store.incremental import partition_key

CHECKS = read_checks([{"accepted_values": {"column": "plan", "values": ["free", "pro"]}}, {"unique": ["id"]},
                      {"row_count_change": {"max_drop": 0.5}}], "weeks")[0]


def test_each_partition_is_measured_apart_even_when_its_rows_span_batches():
    plan = CheckPlan(CHECKS, ("week",))
    first = pa.table({"week": ["w1", "w1", "w2"], "id": [1, 2, 1], "plan": ["free", "gold", "pro"]})
    second = pa.table({"week": pa.array(["w1", None]).dictionary_encode(), "id": [2, 3], "plan": ["gold", "pro"]})
    groups = plan.combine_by([plan.arrow_partials_by(first), plan.arrow_partials_by(second)])
    accepted, unique = plan.alias["accepted_values_plan"], plan.alias["unique_id"]
    assert {k: (v[ROWS], v[accepted], v[unique]) for k, v in groups.items()} == {
        ("w1",): (3, 2, 2), ("w2",): (1, 0, 1), (None,): (1, 0, 1)}


def test_a_partition_is_named_as_an_incremental_stage_names_its_directory():
    types = {"day": pa.date32(), "n": pa.int64(), "s": pa.string()}
    for values, path in (((dt.date(2026, 11, 23), 7, "a b"), "day=2026-11-23/n=07/s=a b/part-0.parquet"),
                         ((dt.date(2026, 1, 2), None, ""), "day=2026-01-02/n=__HIVE_DEFAULT_PARTITION__/s=/x.parquet")):
        assert partition_name(("day", "n", "s"), values) == partition_key(PurePosixPath(path), ("day", "n", "s"), types)


def test_a_partition_is_compared_with_its_published_count_and_a_new_one_with_the_median():
    published = Published(18, {"week=w1": 4, "week=w2": 6, "week=w3": 8, "week=w4": 100})
    assert published.of("week=w2") == (6, "published in week=w2")
    assert published.of("week=w9")[0] == 7  # the median of 4, 6, 8 and 100
    assert published.of(None) == (18, "published")
    assert Published(18, None).of("week=w1") == (None, "published")

    plan = CheckPlan(CHECKS, ("week",))
    change = CHECKS[2]
    truncated = judge("weeks", change, {ROWS: 2}, plan, published, partition="week=w2")
    assert truncated.status == "failed" and truncated.partition == "week=w2"
    assert truncated.line() == ("dataset 'weeks', partition week=w2: check 'row_count_change' (row_count_change) "
                                "failed: 2 rows against 6 published in week=w2 (0.33x; allowed at least 0.50x)")
    assert truncated.record()["partition"] == "week=w2"
    assert judge("weeks", change, {ROWS: 5}, plan, published, partition="week=w9").status == "passed"


def test_a_manifest_counts_each_partitions_rows_from_the_footers(tmp_path):
    for folder, rows in (("week=w1", 3), ("week=w2", 2), ("week=w1", 4)):
        (tmp_path / folder).mkdir(exist_ok=True)
        pq.write_table(pa.table({"id": list(range(rows))}), tmp_path / folder / f"part-{rows}.parquet")
    footers = [(f, *read_footer("weeks", f)) for f in sorted(tmp_path.rglob("*.parquet"))]
    schema = pa.schema([("id", pa.int64()), ("week", pa.string())])
    assert partition_rows(tmp_path, footers, ("week",), schema) == {"week=w1": 7, "week=w2": 2}


def test_untouched_partitions_keep_their_recorded_outcomes():
    manifest = {"checks": [{"check": "row_count", "partition": "week=w1"},
                           {"check": "row_count", "partition": "week=w2"}, {"check": "freshness"}]}
    assert carried_checks(manifest, ("week=w1",)) == [{"check": "row_count", "partition": "week=w1"}]
    assert carried_checks({}, ("week=w1",)) == []
