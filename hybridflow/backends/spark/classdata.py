"""Class-data sharing for the driver JVM. A Spark session loads and verifies tens of thousands of
classes as it starts and runs its first job; the JVM can archive them as one session ends
(-XX:ArchiveClassesAtExit) and map that archive at the next start (-XX:SharedArchiveFile), which
takes about 40% off a local session's start and first job (docs/benchmarks.md, "Engine settings").

One archive per Java, Spark and driver classpath, in the jar cache. The first session on it writes
it beside its place as its JVM exits; it is renamed into its place once that JVM ended cleanly and
the file starts as an archive does, so an archive found is whole. A user's own -Xshare,
SharedArchiveFile or ArchiveClassesAtExit in spark.driver.extraJavaOptions turns ours off."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ...engines.spark.s3_jars import cache_root
from ...processes import running

FOLDER = "spark-class-data"  # under the jar cache's root
WRITE_WAIT = 60.0  # seconds a JVM may take to write the archive as it exits, before it is killed
_MAGIC = b"\xa8\xab\x0b\xf0"  # the first bytes of a dynamic class-data archive (0xf00baba8)
_USERS_OWN = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")
_QUIET = "-Xlog:cds*=off"  # a classpath that changed or a signed jar left out is not the run's news
_STALE = 3600.0  # seconds after which an archive some process was writing is dropped as abandoned


@dataclass(frozen=True)
class ClassData:
    archive: Path
    writing: Path | None  # where this JVM writes the archive as it exits; None: it maps `archive`

    @property
    def java_options(self) -> str:
        if self.writing is None:
            return f"{shlex.quote(f'-XX:SharedArchiveFile={self.archive}')} {_QUIET}"
        return f"{shlex.quote(f'-XX:ArchiveClassesAtExit={self.writing}')} {_QUIET}"

    def end(self, jvm: subprocess.Popen, interrupted: bool = False) -> None:
        """End the driver JVM (its gateway shut down already): at once when it maps the archive or
        its work was `interrupted` (a stop request or timeout: no wait for the archive then); else let
        it write the archive as it exits (pyspark's gateway exits when its stdin closes), up to
        WRITE_WAIT seconds, and put the archive in its place."""
        if self.writing is None or interrupted:
            jvm.kill()
            jvm.wait()
            if self.writing is not None:
                with contextlib.suppress(OSError):
                    self.writing.unlink()
            return
        try:
            if jvm.stdin is not None:
                jvm.stdin.close()
            jvm.wait(WRITE_WAIT)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            jvm.kill()
            jvm.wait()
        try:
            if jvm.returncode == 0 and _whole(self.writing):
                os.replace(self.writing, self.archive)
            elif jvm.returncode == 0:  # exited cleanly, wrote nothing: this Java cannot archive classes
                _unsupported(self.archive).touch()
        except OSError:
            pass  # a cache that cannot be written to: the next session starts as this one did
        with contextlib.suppress(OSError):
            self.writing.unlink()


def class_data(conf: dict[str, str]) -> ClassData | None:
    """The archive for a driver JVM launched with `conf`: to map, or to write as it exits; None when
    the pipeline chose its own class-data options, or there is no Java or cache to key or hold it."""
    if any(flag in conf.get("spark.driver.extraJavaOptions", "") for flag in _USERS_OWN):
        return None
    key = _key(conf)
    if key is None:
        return None
    folder = cache_root() / FOLDER
    archive = folder / f"{key}.jsa"
    if _whole(archive):
        return ClassData(archive, None)
    if _unsupported(archive).exists():
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _drop_abandoned(folder)
    except OSError:
        return None
    if not os.access(folder, os.W_OK | os.X_OK):  # another user's cache: the JVM could write nothing there
        return None
    return ClassData(archive, folder / f"{key}.{os.getpid()}-{secrets.token_hex(4)}.writing")


def _key(conf: dict[str, str]) -> str | None:
    """What an archive is valid for: the Java binary and its modules, Spark's jars, and the driver's
    classpath, heap and options (a JVM refuses an archive written with another classpath or heap layout)."""
    java = _java()
    spark_home = _spark_home()
    if java is None or spark_home is None:
        return None
    parts = [str(java), *_identity(java), *_identity(java.parent.parent / "lib" / "modules")]
    jars = spark_home / "jars"
    with contextlib.suppress(OSError):
        parts += sorted(f"{jar.name}:{jar.stat().st_size}" for jar in jars.iterdir())
    parts += [conf.get(name, "") for name in
              ("spark.driver.extraClassPath", "spark.driver.memory", "spark.driver.extraJavaOptions")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _java() -> Path | None:
    """The java that spark-submit runs: JAVA_HOME's, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found or not os.path.isfile(found):
        return None
    return Path(os.path.realpath(found))


def _spark_home() -> Path | None:
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home)
    import pyspark

    return Path(pyspark.__file__).parent


def _identity(path: Path) -> list[str]:
    try:
        found = path.stat()
    except OSError:
        return [f"{path}:missing"]
    return [f"{path}:{found.st_size}:{found.st_mtime_ns}"]


def _whole(path: Path) -> bool:
    try:
        with open(path, "rb") as archive:
            return archive.read(len(_MAGIC)) == _MAGIC
    except OSError:
        return False


def _unsupported(archive: Path) -> Path:
    return archive.with_suffix(".unsupported")


def _drop_abandoned(folder: Path) -> None:
    """Archives being written by a process that is gone (killed as it ended), or for over an hour."""
    for writing in folder.glob("*.writing"):
        pid = writing.name.split(".")[-2].split("-")[0]
        with contextlib.suppress(OSError, ValueError):
            if running(int(pid)) and time.time() - writing.stat().st_mtime < _STALE:
                continue
            writing.unlink()
