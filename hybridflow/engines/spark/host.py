"""What Spark needs on the machine that runs its driver, checked without starting Spark: Java 17 or
later (`hybridflow doctor`, with the environment cron gives a run), and for GPU stages the RAPIDS
Accelerator jar. The Spark engine's declaration (hybridflow.engines.spark) points the registry here;
nothing outside engines/ and backends/ knows that an engine needs Java or a jar."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterable, Mapping

MIN_JAVA = 17
JAVA_FIX = "apt-get install openjdk-17-jre-headless, or set JAVA_HOME to a JDK 17+"

JAR_ENV = "HYBRIDFLOW_RAPIDS_JAR"
# The RAPIDS Accelerator built for Scala 2.13, which Spark 4 uses (Maven: com.nvidia:rapids-4-spark_2.13)
DEFAULT_JAR_GLOB = "~/.hybridflow/jars/rapids-4-spark_2.13-*.jar"
JAR_HINT = ("download rapids-4-spark_2.13-<version>.jar from Maven Central into ~/.hybridflow/jars/, "
            f"or set backends.spark.rapids_jar or ${JAR_ENV}")


def doctor_checks(environ: Mapping[str, str], needed: str) -> Iterable[tuple[str, str, str, str]]:
    """Java, found as Spark finds it (JAVA_HOME, else java on PATH), and its version."""
    home = environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java", path=environ.get("PATH", os.defpath))
    if java is None or not os.access(java, os.X_OK):
        where = f"JAVA_HOME/bin/java ({java})" if home else "java on PATH"
        yield "java", needed, f"no {where}, which Spark needs", JAVA_FIX
        return
    version = java_version(java, environ)
    if version is None:
        yield "java", needed, f"{java} -version did not say its version", JAVA_FIX
    elif version < MIN_JAVA:
        yield "java", needed, f"Java {version} at {java}; Spark needs {MIN_JAVA} or later", JAVA_FIX
    else:
        yield "java", "ok", f"Java {version} at {java}", ""


def java_version(java: str, environ: Mapping[str, str]) -> int | None:
    """The major version `java -version` reports ("1.8.0_392" is 8, "17.0.9" is 17)."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, env=dict(environ), timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def find_rapids_jar(settings, root: Path | None = None) -> tuple[Path | None, str]:
    """The Spark RAPIDS jar: backends.spark.rapids_jar (relative to root), else $HYBRIDFLOW_RAPIDS_JAR,
    else the newest ~/.hybridflow/jars/rapids-4-spark_2.13-*.jar. Returns (path or None, where it looked)."""
    configured = getattr(settings, "rapids_jar", None)
    for origin, value in (("backends.spark.rapids_jar", configured), (f"${JAR_ENV}", os.environ.get(JAR_ENV))):
        if value:
            path = Path(value).expanduser()
            path = path if path.is_absolute() or root is None else root / path
            return (path, origin) if path.is_file() else (None, f"{origin} = {path}, which does not exist")
    matches = sorted(glob.glob(os.path.expanduser(DEFAULT_JAR_GLOB)), key=_version_key)
    return (Path(matches[-1]), DEFAULT_JAR_GLOB) if matches else (None, f"nothing matches {DEFAULT_JAR_GLOB}")


def _version_key(path: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", Path(path).name)]
