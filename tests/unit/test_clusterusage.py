"""What a cluster brought up for a run cost, from the run's recorded timeline: overlapping stages of
its engine count once as busy, stages of other engines not at all, a killed run has no teardown and
no node-seconds, and a failed bring-up was never up."""

from __future__ import annotations

import pytest

from hybridflow.reporting.clusterusage import cluster_usage
from hybridflow.reporting.timeline import ATTEMPT, CLUSTER_DOWN, CLUSTER_UP, ENGINE_START

STAGES = [{"stage": "etl", "backend": "spark"}, {"stage": "a", "backend": "dask"},
          {"stage": "b", "backend": "dask"}, {"stage": "tune", "backend": "ray"}]


def span(kind, start, end, stage=None, detail=None, outcome="ok", nodes=None):
    return {"kind": kind, "started_at": start, "ended_at": end, "stage": stage, "detail": detail,
            "outcome": outcome, "nodes": nodes}


def test_busy_is_the_time_a_stage_of_its_engine_ran_and_the_rest_of_its_life_is_idle():
    spans = [span(CLUSTER_UP, 100, 130, detail="dask", nodes=3), span(ENGINE_START, 130, 132, detail="dask"),
             span(ATTEMPT, 140, 160, stage="a"), span(ATTEMPT, 150, 170, stage="b"),  # overlapping: 30 s
             span(ATTEMPT, 165, 200, stage="tune"),  # Ray's: not this cluster's work
             span(ATTEMPT, 90, 99, stage="etl"), span(CLUSTER_DOWN, 180, 185, detail="dask")]
    [usage] = cluster_usage(spans, STAGES)
    assert (usage.engine, usage.nodes, usage.up, usage.busy, usage.idle, usage.down) == ("dask", 3, 30, 30, 20, 5)
    assert usage.node_seconds == 3 * (185 - 100) and usage.outcome == "ok"


def test_a_killed_run_has_no_teardown_and_so_no_node_seconds_and_a_failed_up_was_never_up():
    spans = [span(CLUSTER_UP, 0, 10, detail="spark", outcome="failed", nodes=None),
             span(CLUSTER_UP, 0, 20, detail="ray", nodes=2), span(ATTEMPT, 25, 40, stage="tune", outcome="stopped")]
    spark, ray = cluster_usage(spans, STAGES)
    assert (spark.engine, spark.busy, spark.idle, spark.down, spark.outcome) == ("spark", 0, 0, None, "failed")
    assert (ray.busy, ray.idle, ray.down, ray.node_seconds) == (15, 5, None, None)


@pytest.mark.parametrize("down_outcome", ["ok", "failed"])
def test_a_cluster_brought_up_twice_counts_twice_and_a_failed_down_says_so(down_outcome):
    spans = [span(CLUSTER_UP, 0, 5, detail="dask", nodes=1), span(ATTEMPT, 5, 10, stage="a"),
             span(CLUSTER_DOWN, 10, 11, detail="dask"),
             span(CLUSTER_UP, 20, 25, detail="dask", nodes=1), span(ATTEMPT, 25, 27, stage="b"),
             span(CLUSTER_DOWN, 30, 31, detail="dask", outcome=down_outcome)]
    first, second = cluster_usage(spans, STAGES)
    assert (first.busy, first.idle, first.node_seconds) == (5, 0, 11)
    assert (second.busy, second.idle, second.node_seconds, second.outcome) == (2, 3, 11, down_outcome)
