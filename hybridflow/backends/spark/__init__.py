"""The Spark engine's backend, one job a module: conf (the SparkSession's conf), backend (the Backend: a
local or attached session, reads, writes, checks), connect (the same through Spark Connect), launch
(the driver JVM's start and end), redaction (secrets out of what Spark records), rapids (GPU stages),
filesizing (files of the target size), schemas (column names quoted), lineage and lineage_jar
(Spark's own OpenLineage events). Its declaration, settings and what is done around Spark without
starting it (connectors and their jars, a standalone cluster's commands) are hybridflow.engines.spark."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .backend import SparkBackend


def create(settings, log_dir: Path) -> SparkBackend:
    """The session's backend, imported here: a run that creates one is the first to need it."""
    if settings is not None and settings.remote:
        from .connect import SparkConnectBackend

        return SparkConnectBackend(settings, log_dir)
    from .backend import SparkBackend

    return SparkBackend(settings, log_dir)
