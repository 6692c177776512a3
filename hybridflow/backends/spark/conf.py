"""The SparkSession's conf: defaults that close Spark's traps for a lossless hand-off (timestamps
written as TIMESTAMP_MICROS instead of INT96, the session time zone pinned to UTC, the UI off,
everything bound to 127.0.0.1, or attached to a master on another host the one local address that
routes there or backends.spark.advertise_address; shuffle partitions sized to the machine), then the
GPU plug-in's, object storage's, the pipeline's own, the cluster's secret, redaction and the driver
JVM's options."""

from __future__ import annotations

import os

from ...engines.spark import SparkMaster
from ...engines.spark.objectstorage import spark_store_conf
from ...engines.spark.standalone import auth_conf
from .lineage import listener_classpath
from .rapids import spark_gpu_conf
from .redaction import redaction_conf


def default_conf(master: SparkMaster, driver: str = "127.0.0.1") -> dict[str, str]:
    """`driver`: the address the driver binds to and tells the executors to connect back to."""
    cores = os.cpu_count() or 2
    local = {"spark.driver.memory": local_driver_memory()} if master.local else {}
    return {
        **local,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": driver,
        "spark.driver.bindAddress": driver,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
        "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
        "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
        "spark.sql.shuffle.partitions": str(max(2, cores * 2)),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.caseSensitive": "false",
        "spark.app.name": "hybridflow",
    }


def local_driver_memory() -> str:
    """The heap of an embedded Spark, whose driver is also its only executor: a quarter of this
    machine's memory, 1 to 16 GiB. Spark's own 1 GiB default runs out on ordinary wide tables
    (the Parquet writer buffers every column: 10,000 columns need several GiB)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return "1g"
    return f"{min(16, max(1, total // 4 // 2**30))}g"


# The driver JVM (in local mode, every task's too) compiles with C2 only code that stays hot (30 times
# HotSpot's thresholds): a run's JVM is young, and compiling code that runs a few thousand times took a
# third of its CPU; long stages reach C2 all the same (docs/benchmarks.md, "Engine settings").
DRIVER_JIT = ("-XX:Tier4InvocationThreshold=150000 -XX:Tier4MinInvocationThreshold=18000 "
              "-XX:Tier4CompileThreshold=450000 -XX:Tier4BackEdgeThreshold=1200000")


def session_conf(spark) -> dict[str, str]:
    """The session conf of `spark` (a SparkBackend): ours, the GPU plug-in's, object storage's, then the
    pipeline's own."""
    gpu_conf = spark_gpu_conf(spark.settings, spark.gpu.plugin) if spark.gpu is not None else {}
    own = {k: str(v) for k, v in spark.settings.conf.items()}
    stored = spark_store_conf(spark.store, own, gpu_conf) if spark.store is not None else {}
    conf = {**default_conf(spark.master, spark.driver or "127.0.0.1"), **gpu_conf, **stored, **own}
    listener = listener_classpath(spark.lineage)  # with lineage: the OpenLineage listener's jar
    if listener:
        conf["spark.driver.extraClassPath"] = ":".join(filter(None, [conf.get("spark.driver.extraClassPath"),
                                                                      listener]))
    if spark.settings.auth_secret:  # never in the conf of result_settings: a secret made per run
        conf.update(auth_conf(spark.settings.auth_secret))
    conf.update(redaction_conf(conf, spark.secrets))
    driver = "spark.driver.extraJavaOptions"  # before the pipeline's own: the JVM takes the last of a flag
    conf[driver] = f"{DRIVER_JIT} {conf.get(driver, '')}".strip()
    # No JVM perf-data file in /tmp (it copies the JVM's arguments, and a killed JVM leaves it).
    # Every exception keeps its message and stack: once an exception is hot, the JVM otherwise
    # throws a bare one, and a corrupt page would no longer be told from a bug in the stage.
    for role, options in (("driver", "-XX:-UsePerfData -XX:-OmitStackTraceInFastThrow"),
                          ("executor", "-XX:-OmitStackTraceInFastThrow")):
        key = f"spark.{role}.extraJavaOptions"
        conf[key] = f"{conf.get(key, '')} {options}".strip()
    return conf
