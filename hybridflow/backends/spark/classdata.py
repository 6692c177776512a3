"""Class-data sharing for the driver JVM. A Spark session loads and verifies tens of thousands of
classes as it starts and runs its first job; the JVM can archive them as one session ends
(-XX:ArchiveClassesAtExit) and map that archive at the next start (-XX:SharedArchiveFile), which
takes about 40% off a local session's start and first job (docs/benchmarks.md, "Engine settings").

One archive per Java, Spark, driver classpath and options, in the jar cache. The first session on
it writes it beside its place as its JVM exits; it is renamed into its place once that JVM ended
cleanly and the file starts as an archive does, so an archive found is whole. One that a JVM did
not map is dropped (the next session writes another); a key whose write failed is left alone for a
week. A user's own -Xshare, SharedArchiveFile or ArchiveClassesAtExit in
spark.driver.extraJavaOptions turns ours off."""

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

FOLDER = "spark-class-data"  # under the jar cache's root
WRITE_WAIT = 60.0  # seconds a JVM may take to write the archive as it exits, before it is killed
_MAGIC = b"\xa8\xab\x0b\xf0"  # the first bytes of a dynamic class-data archive (0xf00baba8)
_USERS_OWN = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")
_QUIET = "-Xlog:cds*=off"  # a classpath that changed or a signed jar left out is not the run's news
_ABANDONED = 3600.0  # seconds after which an archive being written is dropped (its JVM was killed)
_RETRY_AFTER = 7 * 86400.0  # seconds a key whose archive could not be written is not tried again
_UNUSED = 30 * 86400.0  # seconds after which an archive no session mapped is dropped


@dataclass(frozen=True)
class ClassData:
    archive: Path
    writing: Path | None  # where this JVM writes the archive as it exits; None: it maps `archive`

    @property
    def java_options(self) -> str:
        if self.writing is None:
            return f"{shlex.quote(f'-XX:SharedArchiveFile={self.archive}')} {_QUIET}"
        return f"{shlex.quote(f'-XX:ArchiveClassesAtExit={self.writing}')} {_QUIET}"

    def check_mapped(self, jvm_pid: int) -> None:
        """Once the JVM started: an archive it was to map and did not (it checks what the key cannot
        see, such as a jar's time) is dropped, so that the next session writes one it can map."""
        if self.writing is not None:
            return
        try:
            with open(f"/proc/{jvm_pid}/maps") as maps:
                mapped = any(line.rstrip("\n").endswith(str(self.archive)) for line in maps)
        except OSError:
            return
        with contextlib.suppress(OSError):
            if mapped:
                os.utime(self.archive)  # in use: kept (_UNUSED)
            else:
                self.archive.unlink()

    def end(self, jvm: subprocess.Popen, interrupted: bool = False) -> None:
        """End the driver JVM (its gateway shut down already): at once when it maps the archive or
        its work was `interrupted` (a stage stopped or timed out: no wait for the archive then);
        else let it write the archive as it exits (pyspark's gateway exits when its stdin closes), up
        to WRITE_WAIT seconds, and put the archive in its place. A write that failed is not tried
        again on this key for a week."""
        if self.writing is None or interrupted:
            _kill(jvm)
            self._drop_writing()
            return
        try:
            if jvm.stdin is not None:
                jvm.stdin.close()
            jvm.wait(WRITE_WAIT)
        except BaseException:  # past the wait, or a stop request during it
            _kill(jvm)
            self._drop_writing()
            with contextlib.suppress(OSError):
                _failed(self.archive).touch()
            raise
        try:
            if jvm.returncode == 0 and _whole(self.writing):
                os.replace(self.writing, self.archive)
            else:
                _failed(self.archive).touch()
        except OSError:
            pass  # a cache that cannot be written to: the next session starts as this one did
        self._drop_writing()

    def _drop_writing(self) -> None:
        if self.writing is not None:
            with contextlib.suppress(OSError):
                self.writing.unlink()


def _kill(jvm: subprocess.Popen) -> None:
    jvm.kill()
    jvm.wait()


def class_data(conf: dict[str, str]) -> ClassData | None:
    """The archive for a driver JVM launched with `conf`: to map, or to write as it exits. None when
    the pipeline chose its own class-data options, or there is no Java, Spark or writable cache to
    key or hold it, or the JVM would refuse to write one (a non-empty folder on its classpath)."""
    if any(flag in conf.get("spark.driver.extraJavaOptions", "") for flag in _USERS_OWN):
        return None
    key = _key(conf)
    if key is None:
        return None
    folder = cache_root() / FOLDER
    archive = folder / f"{key}.jsa"
    if ":" in str(archive):  # the JVM reads a colon there as a list of archives
        return None
    if _whole(archive):
        return ClassData(archive, None)
    if _age(_failed(archive)) < _RETRY_AFTER:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _drop_old(folder)
    except OSError:
        return None
    if not os.access(folder, os.W_OK | os.X_OK):  # another user's cache: the JVM could write nothing there
        return None
    return ClassData(archive, folder / f"{key}.{os.getpid()}-{secrets.token_hex(4)}.writing")


def _key(conf: dict[str, str]) -> str | None:
    """What an archive is valid for, as far as can be seen from here: the Java binary and its modules,
    Spark's home and jars, the classpath the launcher adds, and the driver's classpath, heap and options
    (the JVM refuses an archive written with another classpath, a changed jar or another heap layout)."""
    java = _java()
    spark_home = _spark_home()
    if java is None or spark_home is None or _nonempty_conf_folder(spark_home):
        return None
    parts = [str(java), *_identity(java), *_identity(java.parent.parent / "lib" / "modules"), str(spark_home)]
    with contextlib.suppress(OSError):
        parts += sorted(_identity(jar)[0] for jar in (spark_home / "jars").iterdir())
    extra = conf.get("spark.driver.extraClassPath", "")
    parts += [entry for path in filter(None, extra.split(os.pathsep)) for entry in _identity(Path(path))]
    parts += [conf.get(name, "") for name in ("spark.driver.extraClassPath", "spark.driver.memory",
                                               "spark.driver.extraJavaOptions")]
    parts += [os.environ.get(name, "") for name in ("SPARK_DIST_CLASSPATH", "SPARK_CLASSPATH")]
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
        return Path(os.path.realpath(home))
    import pyspark

    return Path(os.path.realpath(Path(pyspark.__file__).parent))


def _nonempty_conf_folder(spark_home: Path) -> bool:
    """Whether the launcher puts a folder with files on the classpath (SPARK_CONF_DIR, else Spark's
    conf/): the JVM refuses to write an archive with one there."""
    conf = Path(os.environ.get("SPARK_CONF_DIR") or spark_home / "conf")
    try:
        return any(conf.iterdir())
    except OSError:
        return False


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


def _failed(archive: Path) -> Path:
    return archive.with_suffix(".failed")


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")


def _drop_old(folder: Path) -> None:
    """Archives some JVM began to write over an hour ago (it was killed as it ended), and archives
    no session mapped for a month."""
    for path in folder.iterdir():
        if (path.suffix == ".writing" and _age(path) > _ABANDONED) or \
                (path.suffix == ".jsa" and _age(path) > _UNUSED):
            with contextlib.suppress(OSError):
                path.unlink()
