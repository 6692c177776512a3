"""The Spark engine, one job a module: declaration (the engine's registry entry and its settings),
backend (the Backend: a local or attached SparkSession, reads, writes, checks), connect (the same
through Spark Connect), host (Java and the RAPIDS jar on this machine), lineage and lineage_jar
(Spark's own OpenLineage events, the listener's jar), s3_jars (hadoop-aws and the AWS SDK, fetched
on first need). The registry reads ENGINE here."""

from .backend import ENGINE, create

__all__ = ["ENGINE", "create"]
