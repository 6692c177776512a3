"""Fetch what Spark needs to read s3:// paths, once: hadoop-aws at the Hadoop version pyspark ships and
the AWS SDK bundle its pom names, from Maven Central with mvn, into ~/.cache/hybridflow/jars (or
$HYBRIDFLOW_JARS), where the Spark backend finds them (spark.s3_jars). Prints the folder.

    python -m hybridflow.backends.spark_s3_jars
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("fetch_spark_s3_jars.sh")


def main() -> int:
    return subprocess.call(["bash", str(SCRIPT), sys.executable])


if __name__ == "__main__":
    sys.exit(main())
