"""A self-contained jar Spark needs for one feature (the OpenLineage listener, the GCS connector),
fetched the first time it is needed: from Maven Central or the mirror HYBRIDFLOW_MAVEN_REPOSITORY
names, checked against the checksum the repository publishes, into a folder of its own under the jar
cache (~/.cache/hybridflow/jars, the root: $HYBRIDFLOW_JARS), beside Spark's s3a jars. A variable of
its own names a jar fetched elsewhere instead."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from ...data.durable import fsync_path
from ...errors import ExitCode, UnavailableError
from ..maven import Artifact, Repository, RepositoryError
from .s3_jars import REPOSITORY_VARIABLE, cache_root, locked, repository_url


@dataclass(frozen=True)
class OneJar:
    what: str  # as messages name it: "the OpenLineage Spark listener"
    folder: str  # its folder under the cache root, before "-<version>"
    variable: str  # names a jar fetched elsewhere, used instead
    command: str  # the command that fetches it ahead (CI, a host without the network at run time)
    size: str  # how much room it takes, for the hint when there is none: "about 50 MB"

    def jar(self, wanted: Artifact, stream: TextIO | None = None) -> Path:
        """The jar: the one the variable names, else the cache's, fetched now the first time.
        UnavailableError when it cannot be had (offline, a mirror without it)."""
        named = os.environ.get(self.variable)
        if named:
            if not Path(named).is_file():
                raise UnavailableError(f"{self.variable} names {named}, which is not a file")
            return Path(named)
        return self.ensure(wanted, repository_url(), cache_root(), stream=stream)

    def check(self, wanted: Artifact) -> str:
        """For `hybridflow doctor`: where the jar is, or that the repository to fetch it from answers (a
        small request: its checksum)."""
        named = os.environ.get(self.variable)
        jar = Path(named) if named else cache_root() / f"{self.folder}-{wanted.version}" / wanted.jar
        if jar.is_file():
            return f"{wanted.jar} in {jar.parent}"
        if named:
            raise UnavailableError(f"{self.variable} names {named}, which is not a file")
        try:
            repository = Repository(repository_url())
            repository.published_checksum(wanted.path("jar"))
        except RepositoryError as exc:
            raise self._unfetchable(wanted, exc) from None
        return f"{wanted.jar} not fetched yet: the first Spark stage that needs it fetches it from {repository.host}"

    def ensure(self, wanted: Artifact, repository: str, cache: Path, *, retries: int = 3, backoff: float = 2.0,
               stream: TextIO | None = None) -> Path:
        """`wanted`'s jar in `cache`, fetched from the Maven `repository` unless it is there: written
        beside its place and renamed into it once its checksum matched, so a jar in the cache is whole."""
        folder = cache / f"{self.folder}-{wanted.version}"
        jar = folder / wanted.jar
        if jar.is_file():
            return jar
        stream = stream or sys.stderr
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with locked(cache, stream, self.what):
                if not jar.is_file():  # fetched by the process that held the lock
                    _fetch(Repository(repository, retries, backoff), wanted, jar, stream)
        except RepositoryError as exc:
            raise self._unfetchable(wanted, exc) from None
        except OSError as exc:
            raise UnavailableError(f"cannot keep {self.what} in {folder}: {exc.strerror or exc}",
                                   hint=f"free space there ({self.size}), or set {self.variable}") from None
        return jar

    def _unfetchable(self, wanted: Artifact, exc: RepositoryError) -> UnavailableError:
        return UnavailableError(f"cannot fetch {self.what} ({wanted.jar}): {exc}",
                                hint=f"check the network, set {REPOSITORY_VARIABLE} to a Maven mirror, or run "
                                     f"`{self.command}` where it works and set {self.variable} to the jar")

    def main(self, wanted: Callable[[], Artifact]) -> int:
        """The fetch-ahead command: prints the jar, or one line and exit 69."""
        try:
            jar = self.jar(wanted())
        except UnavailableError as exc:
            print(f"{self.command.rsplit('.', 1)[-1]}: error: {exc.one_line()}", file=sys.stderr)
            return int(ExitCode.UNAVAILABLE)
        print(jar)
        return 0


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
