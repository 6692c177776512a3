"""The Spark engine, one job a module: declaration (its registry entry and settings), conf (the
SparkSession's conf), backend (the Backend: a local or attached session, reads, writes, checks),
connect (the same through Spark Connect), launch (the driver JVM's start and end), redaction
(secrets out of what Spark records), rapids (GPU stages), objectstorage and s3_jars (s3a paths, conf
and jars), filesizing (files of the target size), schemas (what Spark cannot hold, quoted names),
standalone (a cluster hybridflow launches), host (Java and the RAPIDS jar here), lineage and
lineage_jar (Spark's own OpenLineage events). The registry reads ENGINE here."""

from .declaration import ENGINE, create

__all__ = ["ENGINE", "create"]
