"""The OpenLineage Spark listener (io.openlineage:openlineage-spark, one self-contained jar of about
40 MB for the Scala version pyspark is built with): fetched the first time a Spark stage runs with
`lineage:` on, from Maven Central or the mirror HYBRIDFLOW_MAVEN_REPOSITORY names, checked against the
checksum the repository publishes, into ~/.cache/hybridflow/jars/openlineage-spark-VERSION (the root:
$HYBRIDFLOW_JARS), beside Spark's s3a jars. HYBRIDFLOW_SPARK_LINEAGE_JAR names a jar to use instead.
To fetch ahead (CI, a host without the network at run time; prints the jar):

    python -m hybridflow.backends.spark_lineage_jar
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from ...data.durable import fsync_path
from ...errors import ExitCode, UnavailableError
from ..maven import Artifact, Repository, RepositoryError
from .s3_jars import REPOSITORY_VARIABLE, cache_root, locked, repository_url

VERSION = "1.53.0"  # the newest on Maven Central with a Scala 2.13 build for Spark 4 (checked 2026-11)
JAR_VARIABLE = "HYBRIDFLOW_SPARK_LINEAGE_JAR"  # a listener jar fetched elsewhere
FETCH_COMMAND = "python -m hybridflow.backends.spark_lineage_jar"


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
    named = os.environ.get(JAR_VARIABLE)
    if named:
        if not Path(named).is_file():
            raise UnavailableError(f"{JAR_VARIABLE} names {named}, which is not a file")
        return Path(named)
    return ensure(artifact(scala_version()), repository_url(), cache_root(), stream=stream)


def ensure(wanted: Artifact, repository: str, cache: Path, *, retries: int = 3, backoff: float = 2.0,
           stream: TextIO | None = None) -> Path:
    """`wanted`'s jar in `cache`, fetched from the Maven `repository` unless it is there: written
    beside its place and renamed into it once its checksum matched, so a jar in the cache is whole."""
    folder = cache / f"openlineage-spark-{wanted.version}"
    jar = folder / wanted.jar
    if jar.is_file():
        return jar
    stream = stream or sys.stderr
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with locked(cache, stream, "the OpenLineage Spark listener"):
            if not jar.is_file():  # fetched by the process that held the lock
                _fetch(Repository(repository, retries, backoff), wanted, jar, stream)
    except RepositoryError as exc:
        raise UnavailableError(f"cannot fetch the OpenLineage Spark listener ({wanted.jar}): {exc}",
                               hint=f"check the network, set {REPOSITORY_VARIABLE} to a Maven mirror, or run "
                                    f"`{FETCH_COMMAND}` where it works and set {JAR_VARIABLE} to the jar") from None
    except OSError as exc:
        raise UnavailableError(f"cannot keep the OpenLineage Spark listener in {folder}: {exc.strerror or exc}",
                               hint=f"free space there (about 50 MB), or set {REPOSITORY_VARIABLE}") from None
    return jar


def _fetch(repository: Repository, wanted: Artifact, jar: Path, stream: TextIO) -> None:
    print(f"hybridflow: fetching {wanted.jar} from {repository.host} into {jar.parent} (once)",
          file=stream, flush=True)
    fd, partial = tempfile.mkstemp(prefix=".fetch-", suffix=".jar", dir=jar.parent)
    os.close(fd)
    try:
        repository.download(wanted.path("jar"), Path(partial), lambda done, total: None)
        os.chmod(partial, 0o644)  # mkstemp's 0600 would hide it from the others sharing the cache
        fsync_path(Path(partial))
        os.replace(partial, jar)
        fsync_path(jar.parent)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def main() -> int:
    try:
        jar = listener_jar()
    except UnavailableError as exc:
        print(f"spark_lineage_jar: error: {exc.one_line()}", file=sys.stderr)
        return int(ExitCode.UNAVAILABLE)
    print(jar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
