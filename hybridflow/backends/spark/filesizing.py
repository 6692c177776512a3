"""Spark's writes in files of the target size: adaptive execution told the target, and an unpartitioned
output's tasks merged down to what the plan's size estimate needs."""

from __future__ import annotations

import math
import re

# Adaptive execution sizes tasks by shuffle bytes (rows, lz4-compressed), which take about this many
# times the bytes of the same rows in snappy Parquet.
SHUFFLE_BYTES_PER_PARQUET_BYTE = 3


def coalesced(frame, target_file_size: int):
    """The frame in at most as many tasks as files of the target size need, by the optimizer's size
    estimate (the bytes of the files a scan reads, an upper bound after filters and aggregations). A
    sorted output is left alone: its ordering shuffle is already sized by adaptive execution."""
    sorted_, estimate = _size_estimate(frame)
    if sorted_:
        return frame
    # a size Spark cannot estimate (a frame made from an RDD) is Long.MaxValue; coalesce takes a Java int
    return frame.coalesce(min(max(1, math.ceil(estimate / target_file_size)), 2**31 - 1))


def _size_estimate(frame) -> tuple[bool, int]:
    """(whether the optimized plan's top is a Sort, its size estimate in bytes): from the JVM's plan, or
    for a Spark Connect frame (no JVM here) from the server's explanation of it."""
    if hasattr(frame, "_jdf"):
        plan = frame._jdf.queryExecution().optimizedPlan()
        return plan.nodeName() == "Sort", int(str(plan.stats().sizeInBytes()))  # a Scala BigInt via py4j
    text = frame._explain_string(mode="cost").split("== Optimized Logical Plan ==", 1)[-1].strip()
    match = re.search(r"sizeInBytes=([\d.]+)\s*(B|KiB|MiB|GiB|TiB|PiB|EiB)?", text)
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50, "EiB": 2**60}
    estimate = int(float(match.group(1)) * units[match.group(2) or "B"]) if match else 0
    return text.startswith("Sort"), estimate


def write_sizing(target_file_size: int) -> dict[str, str]:
    return {"spark.sql.adaptive.enabled": "true",
            "spark.sql.adaptive.coalescePartitions.enabled": "true",
            "spark.sql.adaptive.coalescePartitions.parallelismFirst": "false",  # honour the size, not the cores
            "spark.sql.adaptive.advisoryPartitionSizeInBytes": str(target_file_size * SHUFFLE_BYTES_PER_PARQUET_BYTE)}
