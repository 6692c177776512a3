"""GPU stages on Spark: the RAPIDS Accelerator plug-in's conf for the session (each stage then switches
it on or off, spark.rapids.sql.enabled), and which operators of an output's physical plan ran on the
GPU (Gpu*) and which fell back to the CPU, for the stage's log."""

from __future__ import annotations

import re
from pathlib import Path

from ...engines.spark import SparkMaster

RAPIDS_PLUGIN = "com.nvidia.spark.SQLPlugin"


def spark_gpu_conf(settings, jar: Path) -> dict[str, str]:
    """The RAPIDS Accelerator's settings (docs: getting-started-on-prem, configs). The plugin uses one GPU
    per executor. Local mode shares the machine's GPU and must not ask Spark for GPU resources (it cannot
    schedule them there and waits forever); a cluster's executors each ask for one GPU, shared by their
    tasks (task amount 1/executor cores). The pipeline's own conf overrides any of these."""
    conf = {
        "spark.plugins": RAPIDS_PLUGIN,
        "spark.jars": str(jar),
        "spark.driver.extraClassPath": str(jar),  # pyspark starts the driver JVM with this conf
        "spark.rapids.sql.enabled": "true",
        "spark.rapids.sql.explain": "NOT_ON_GPU",  # why an operator stayed on the CPU, in engines.log
        "spark.rapids.sql.concurrentGpuTasks": "1",
        "spark.rapids.memory.pinnedPool.size": "2g",  # pinned host memory for host <-> GPU copies
        "spark.locality.wait": "0s",
        "spark.sql.files.maxPartitionBytes": "512m",
    }
    if not SparkMaster.of(settings).local:
        cores = settings.conf.get("spark.executor.cores")
        conf["spark.executor.resource.gpu.amount"] = "1"
        conf["spark.task.resource.gpu.amount"] = f"{1 / int(cores):.4g}" if cores else "0.25"
    return conf


def gpu_operators(plan: str) -> tuple[list[str], list[str]]:
    """The operators of a physical plan (explain output) on the GPU (Gpu*), and the others."""
    names = []
    for line in plan.split("== Physical Plan ==")[-1].splitlines():
        # tree drawing, then whole-stage codegen's "*(1) ", then the operator's name
        match = re.match(r"[\s+\-:|!*]*(?:\(\d+\)\s*)?([A-Z][A-Za-z0-9]*)", line)
        if match and match.group(1) not in ("AdaptiveSparkPlan", "Subquery", "ReusedSubquery"):
            names.append(match.group(1))
    return [n for n in names if n.startswith("Gpu")], [n for n in names if not n.startswith("Gpu")]
