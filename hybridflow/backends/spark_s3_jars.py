"""`python -m hybridflow.backends.spark_s3_jars`, the command that messages and docs name: fetches
Spark's s3a jars ahead (hybridflow.engines.spark.s3_jars)."""

import sys

from ..engines.spark.s3_jars import main

if __name__ == "__main__":
    sys.exit(main())
