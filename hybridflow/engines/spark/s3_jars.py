"""What Spark needs to read and write s3:// paths: hadoop-aws at the Hadoop version pyspark ships and
what its POM needs at run time (the AWS SDK bundle, ~690 MB, and the S3 analytics accelerator). The
first Spark stage on s3:// fetches them, as `spark.jars.packages` would, but from this host only and
without Maven: from Maven Central, or the mirror HYBRIDFLOW_MAVEN_REPOSITORY names, each file checked
against the checksum the repository publishes, into ~/.cache/hybridflow/jars/hadoop-VERSION (the root:
$HYBRIDFLOW_JARS). HYBRIDFLOW_SPARK_S3_JARS names a folder of them to use instead. To fetch ahead (CI,
each worker of a cluster; prints the folder):

    python -m hybridflow.backends.spark_s3_jars
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from ...data.durable import fsync_path
from ...errors import ExitCode, UnavailableError
from ...installing import install_extras
from ..maven import CENTRAL, Artifact, Repository, RepositoryError, compile_dependencies

REPOSITORY_VARIABLE = "HYBRIDFLOW_MAVEN_REPOSITORY"  # a Maven mirror's root URL (a user:token@ in it is kept secret)
CACHE_VARIABLE = "HYBRIDFLOW_JARS"  # the cache's root
FOLDER_VARIABLE = "HYBRIDFLOW_SPARK_S3_JARS"  # a folder of hadoop-aws and the AWS SDK jars, fetched elsewhere
COMPLETE = ".complete"  # in a finished folder: the names of its jars, one a line
FETCHING = ".fetch-"  # the prefix of a download's own folder in the cache root, until it is complete
FETCH_COMMAND = "python -m hybridflow.backends.spark_s3_jars"


def hadoop_version() -> str:
    """The Hadoop version pyspark ships (its hadoop-client-api jar), found without importing pyspark."""
    import importlib.util

    found = importlib.util.find_spec("pyspark")
    folders = list(found.submodule_search_locations or []) if found else []
    shipped = sorted(jar for folder in folders for jar in (Path(folder) / "jars").glob("hadoop-client-api-*.jar"))
    if not shipped:
        raise UnavailableError("Spark's s3a jars match the Hadoop version pyspark ships, and pyspark (with its "
                               "jars) is not installed", hint=install_extras("spark"))
    return shipped[0].stem.removeprefix("hadoop-client-api-")


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "hybridflow" / "jars")


def repository_url() -> str:
    return os.environ.get(REPOSITORY_VARIABLE) or CENTRAL


def cached(folder: Path) -> list[Path] | None:
    """The jars of a finished fetch into `folder`, or None (never fetched, or not to the end)."""
    try:
        names = (folder / COMPLETE).read_text().split()
    except OSError:
        return None
    jars = [folder / name for name in names]
    if not names or not all(jar.is_file() and jar.stat().st_size > 0 for jar in jars):
        return None
    return sorted(jars)


def s3_jars() -> list[Path]:
    """The jars to put on Spark's classpath: the folder HYBRIDFLOW_SPARK_S3_JARS names, else the cache's,
    fetched now if this is the first time."""
    named = os.environ.get(FOLDER_VARIABLE)
    if named:
        return _named_folder(Path(named), hadoop_version())
    return ensure(hadoop_version(), repository_url(), cache_root())


def _named_folder(folder: Path, version: str) -> list[Path]:
    jars = sorted(folder.glob("*.jar"))
    if not any(jar.name.startswith(f"hadoop-aws-{version}") for jar in jars):
        raise UnavailableError(f"Spark reads s3:// paths with hadoop-aws {version} and the AWS SDK, which are not "
                               f"in {folder} ({FOLDER_VARIABLE})", hint=f"unset {FOLDER_VARIABLE} to have them "
                               f"fetched on first use, or copy there the jars `{FETCH_COMMAND}` fetches")
    return jars


def check() -> str:
    """For `hybridflow doctor`: where the jars are, or that the repository to fetch them from answers
    (a small request: the 690 MB wait for the first Spark stage)."""
    version, named = hadoop_version(), os.environ.get(FOLDER_VARIABLE)
    folder = Path(named) if named else cache_root() / f"hadoop-{version}"
    if (named and _named_folder(folder, version)) or cached(folder):
        return f"hadoop-aws and the AWS SDK in {folder}"
    repository = _repository(repository_url())
    try:
        repository.published_checksum(Artifact("org.apache.hadoop", "hadoop-aws", version).path("pom"))
    except RepositoryError as exc:
        raise _unavailable(exc, version) from None
    return (f"hadoop-aws {version} and the AWS SDK not fetched yet: the first Spark stage on s3:// fetches them "
            f"(several hundred MB) from {repository.host} into {folder}")


def ensure(version: str, repository: str, cache: Path, *, retries: int = 3, backoff: float = 2.0,
           stream: TextIO | None = None) -> list[Path]:
    """The jars for hadoop-aws `version` in `cache`, fetched from the Maven `repository` unless a
    finished fetch is there. Two processes fetching at once take turns (a lock in the cache root): the
    second finds the first one's jars. A fetch that fails leaves nothing in the cache but its lock."""
    folder = cache / f"hadoop-{version}"
    jars = cached(folder)
    if jars:
        return jars
    stream = stream or sys.stderr
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with locked(cache, stream, "Spark's s3a jars"):
            jars = cached(folder)  # fetched by the process that held the lock
            if jars:
                return jars
            _fetch(_repository(repository, retries, backoff), version, cache, folder, stream)
    except RepositoryError as exc:
        raise _unavailable(exc, version) from None
    except OSError as exc:
        raise UnavailableError(f"cannot keep Spark's s3a jars in {cache}: {exc.strerror or exc}", hint="free "
                               f"space there (about 700 MB), or set {CACHE_VARIABLE} to a folder with room") from None
    return cached(folder) or []


def _repository(url: str, retries: int = 3, backoff: float = 2.0) -> Repository:
    try:
        return Repository(url, retries, backoff)
    except RepositoryError as exc:
        raise UnavailableError(f"{REPOSITORY_VARIABLE} is {exc}", hint="give a Maven repository's root, like "
                                                                     f"{CENTRAL}") from None


def _unavailable(exc: RepositoryError, version: str) -> UnavailableError:
    return UnavailableError(f"cannot fetch Spark's s3a jars (hadoop-aws {version} and the AWS SDK): {exc}",
                            hint=f"check the network, set {REPOSITORY_VARIABLE} to a Maven mirror, or run "
                                 f"`{FETCH_COMMAND}` where it works and set {FOLDER_VARIABLE} to its folder")


@contextlib.contextmanager
def locked(cache: Path, stream: TextIO, what: str):
    """The cache's fetches one at a time, across processes: a second one waits, and says so."""
    with open(cache / ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"hybridflow: waiting for another process fetching {what} into {cache}",
                  file=stream, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # the lock goes with the file's closing


def _fetch(repository: Repository, version: str, cache: Path, folder: Path, stream: TextIO) -> None:
    """Download into a folder of this fetch's own beside `folder`, then rename it into place, complete."""
    for leftover in cache.glob(f"{FETCHING}*"):  # of a fetch that was killed (we hold the lock)
        shutil.rmtree(leftover, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=FETCHING, dir=cache))
    work.chmod(0o755)  # mkdtemp's 0700 would hide the jars from the others sharing a cache ($HYBRIDFLOW_JARS)
    try:
        hadoop_aws = Artifact("org.apache.hadoop", "hadoop-aws", version)
        artifacts = [hadoop_aws, *compile_dependencies(repository, hadoop_aws)]
        with _display(stream, repository.host, artifacts, folder) as show:
            for artifact in artifacts:
                repository.download(artifact.path("jar"), work / artifact.jar, show(artifact.jar))
        for artifact in artifacts:
            fsync_path(work / artifact.jar)
        (work / COMPLETE).write_text("".join(f"{artifact.jar}\n" for artifact in artifacts))
        fsync_path(work / COMPLETE)
        if folder.exists():  # an unfinished folder an older fetcher left
            shutil.rmtree(folder)
        os.rename(work, folder)
        fsync_path(cache)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _display(stream: TextIO, host: str, artifacts: list[Artifact], folder: Path):
    """Yields, for a jar's name, the `progress(bytes, total)` to download it with: a bar per jar on a
    terminal, else one line before and one after (a run's engines.log, CI)."""
    names = ", ".join(artifact.jar for artifact in artifacts)
    if not stream.isatty():
        started, received = time.monotonic(), {}
        print(f"spark_s3_jars: fetching {names} from {host} into {folder}", file=stream, flush=True)

        def count(name: str):
            def progress(done: int, total: int | None) -> None:
                received[name] = done
            return progress
        yield count
        print(f"spark_s3_jars: fetched {sum(received.values()) / 1e6:.0f} MB in "
              f"{time.monotonic() - started:.0f} s", file=stream, flush=True)
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    console = Console(file=stream)
    console.print(f"fetching Spark's s3a jars from {host} into {folder} (once)", markup=False, highlight=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=console) as bars:
        def bar(name: str):
            task = bars.add_task(name, total=None)
            return lambda done, total: bars.update(task, completed=done, total=total)
        yield bar


def main() -> int:
    try:
        jars = s3_jars()
    except UnavailableError as exc:
        print(f"spark_s3_jars: error: {exc.one_line()}", file=sys.stderr)
        return int(ExitCode.UNAVAILABLE)
    print(jars[0].parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
