"""Google's Cloud Storage connector for Hadoop (com.google.cloud.bigdataoss:gcs-connector, its shaded
jar: one self-contained jar of about 37 MB), through which Spark reads and writes gs:// paths: fetched
the first time a Spark stage reaches gs://, into ~/.cache/hybridflow/jars/gcs-connector-VERSION, as
jarcache.py fetches. HYBRIDFLOW_SPARK_GCS_JAR names a jar to use instead. To fetch ahead (CI, each
worker of a cluster, a host without the network at run time; prints the jar):

    python -m hybridflow.engines.spark.gcs_jar
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from ..maven import Artifact
from .jarcache import OneJar

VERSION = "3.1.18"  # built for Hadoop 3.4's API, which Spark 4's Hadoop 3.5 keeps (but vectored reads)
JAR_VARIABLE = "HYBRIDFLOW_SPARK_GCS_JAR"  # a connector jar fetched elsewhere
FETCH_COMMAND = "python -m hybridflow.backends.spark_gcs_jar"
CONNECTOR = OneJar("Spark's GCS connector", "gcs-connector", JAR_VARIABLE, FETCH_COMMAND, "about 40 MB")


def artifact(version: str = VERSION) -> Artifact:
    return Artifact("com.google.cloud.bigdataoss", "gcs-connector", version, "shaded")


def connector_jar(stream: TextIO | None = None) -> Path:
    """The connector's jar: the one HYBRIDFLOW_SPARK_GCS_JAR names, else the cache's, fetched now the
    first time. UnavailableError when it cannot be had (offline, a mirror without it)."""
    return CONNECTOR.jar(artifact(), stream)


def check() -> str:
    """For `hybridflow doctor`: where the connector is, or that the repository to fetch it from answers."""
    return CONNECTOR.check(artifact())


def main() -> int:
    """Fetch the connector ahead (python -m hybridflow.backends.spark_gcs_jar)."""
    return CONNECTOR.main(artifact)
