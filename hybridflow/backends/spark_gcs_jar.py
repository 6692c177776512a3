"""`python -m hybridflow.backends.spark_gcs_jar`, the command that messages and docs name: fetches
Spark's GCS connector ahead (hybridflow.engines.spark.gcs_jar)."""

import sys

from ..engines.spark.gcs_jar import main

if __name__ == "__main__":
    sys.exit(main())
