"""The Spark engine, one job a module: declaration (its registry entry and settings), conf (the
SparkSession's conf), backend (the Backend: a local or attached session, reads, writes, checks),
connect (the same through Spark Connect), launch (the driver JVM's start and end), redaction
(secrets out of what Spark records), rapids (GPU stages), objectstorage (each store's Hadoop
connector: paths, conf and jars; s3_jars fetches s3a's, gcs_jar Google's GCS connector), filesizing
(files of the target size), schemas (what Spark cannot hold, quoted names), standalone (a cluster
hybridflow launches), host (Java and the RAPIDS jar here), lineage and lineage_jar (Spark's own
OpenLineage events), jarcache (a self-contained jar fetched once). The registry reads ENGINE here."""

from .declaration import ENGINE, create

__all__ = ["ENGINE", "create"]
