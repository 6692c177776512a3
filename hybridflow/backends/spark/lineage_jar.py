"""The OpenLineage Spark listener (io.openlineage:openlineage-spark, one self-contained jar of about
40 MB for the Scala version pyspark is built with): fetched the first time a Spark stage runs with
`lineage:` on, from Maven Central or the mirror HYBRIDFLOW_MAVEN_REPOSITORY names, checked against the
checksum the repository publishes, into ~/.cache/hybridflow/jars/openlineage-spark-VERSION (the root:
$HYBRIDFLOW_JARS), beside Spark's s3a jars. HYBRIDFLOW_SPARK_LINEAGE_JAR names a jar to use instead.
To fetch ahead (CI, a host without the network at run time; prints the jar):

    python -m hybridflow.backends.spark_lineage_jar
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ...engines.maven import Artifact
from ...engines.spark.jarcache import OneJar
from ...errors import UnavailableError

VERSION = "1.53.0"  # the newest on Maven Central with a Scala 2.13 build for Spark 4 (checked 2026-11)
JAR_VARIABLE = "HYBRIDFLOW_SPARK_LINEAGE_JAR"  # a listener jar fetched elsewhere
FETCH_COMMAND = "python -m hybridflow.backends.spark_lineage_jar"
LISTENER = OneJar("the OpenLineage Spark listener", "openlineage-spark", JAR_VARIABLE, FETCH_COMMAND, "about 50 MB")


def scala_version() -> str:
    """The Scala binary version pyspark's jars are built for (2.13 for Spark 4), found without
    importing pyspark: from its scala-library jar."""
    import importlib.util

    found = importlib.util.find_spec("pyspark")
    folders = list(found.submodule_search_locations or []) if found else []
    shipped = sorted(jar for folder in folders for jar in (Path(folder) / "jars").glob("scala-library-*.jar"))
    if not shipped:
        raise UnavailableError("pyspark (with its jars) is not installed")
    return ".".join(shipped[0].stem.removeprefix("scala-library-").split(".")[:2])


def artifact(scala: str, version: str = VERSION) -> Artifact:
    return Artifact("io.openlineage", f"openlineage-spark_{scala}", version)


def listener_jar(stream: TextIO | None = None) -> Path:
    """The listener's jar: the one HYBRIDFLOW_SPARK_LINEAGE_JAR names, else the cache's, fetched now
    the first time. UnavailableError when it cannot be had (offline, a mirror without it)."""
    return LISTENER.jar(artifact(scala_version()), stream)


def main() -> int:
    """Fetches the listener ahead: prints the jar, or one line and exit 69."""
    return LISTENER.main(lambda: artifact(scala_version()))


if __name__ == "__main__":
    sys.exit(main())
