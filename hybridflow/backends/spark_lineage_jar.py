"""`python -m hybridflow.backends.spark_lineage_jar`, the command that messages and docs name:
fetches the OpenLineage Spark listener's jar ahead (hybridflow.backends.spark.lineage_jar)."""

import sys

from .spark.lineage_jar import main

if __name__ == "__main__":
    sys.exit(main())
