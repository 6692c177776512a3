"""Spark through Spark Connect (`backends.spark.remote: sc://host:15002`), the way Spark 4 clusters and
Databricks are reached: stage functions get a Connect SparkSession, and the reads, writes and SQL of
the Spark backend go through it unchanged. What needs the JVM in this process (the status tracker that
counts jobs, RDDs, shipping code with addPyFile) has its Connect counterpart or is left out: stage code
is shipped as an artifact of the session, a cancel interrupts the session's operations, and no engine
work is counted. A stage that calls an API Connect does not offer (sparkContext, RDDs) fails with
pyspark's own one-line error, naming the call, at the stage's line.

The server reads and writes the workdir itself: it must see a local workdir under the same path, or
the workdir is in object storage that the server is set up to reach (its own s3a settings).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from ...engines.spark import SparkMaster
from ...errors import UnavailableError, first_line
from ..clusterchecks import check_reachable, split_host_port
from ..shippedcode import code_archive
from .backend import SparkBackend

log = logging.getLogger("hybridflow")
DEFAULT_PORT = 15002


class SparkConnectBackend(SparkBackend):
    def __init__(self, settings, log_dir: Path) -> None:
        super().__init__(settings, log_dir)
        self.master = SparkMaster(settings.remote)  # neither local nor standalone; messages name its URL

    def start(self, code: Sequence[Path] = ()) -> None:
        remote = self.settings.remote
        host, port = split_host_port(remote.removeprefix("sc://").split("/", 1)[0], DEFAULT_PORT)
        check_reachable("spark", remote, host, port)  # one line, exit 69, when nothing answers there
        from pyspark.sql import SparkSession

        url = remote if "/;" in remote else remote.rstrip("/") + "/"
        if self.settings.token:  # in the URL only: pyspark sends it as a bearer token, never logs it
            url += f";token={self.settings.token}"
        try:
            self.session = SparkSession.builder.remote(url).getOrCreate()
            for key, value in self.settings.conf.items():
                self._set(key, str(value))
            for path in code:  # Python UDFs run on the server's workers, which import the stage modules
                self.session.addArtifacts(str(code_archive(path, self.log_dir)), pyfile=True)
        except Exception as exc:
            self.stop()
            raise UnavailableError(f"spark: cannot attach to the Spark Connect server at {remote}: "
                                   f"{self._redacted(first_line(exc))}",
                                   hint="check remote: and token: (a token needs TLS unless the server is on "
                                        "localhost)") from exc

    def _set(self, key: str, value: str) -> None:
        """A setting of the pipeline's spark conf on the session; those fixed when the server started
        (static ones) are the server's to set: said in the log, not an error."""
        try:
            self.session.conf.set(key, value)
        except Exception as exc:
            log.warning("spark conf %s is not set on the Spark Connect session: %s", key, first_line(exc))

    def _redacted(self, text: str) -> str:
        return text.replace(self.settings.token, "***") if self.settings.token else text

    def reload_code(self, code: Sequence[Path]) -> bool:
        return False  # the server's workers keep what they imported: a fresh session takes the new code

    def check_shared_workdir(self, workdir: Path) -> bool:
        return False  # a Connect session runs no job of hybridflow's own to ask; see the module's notes

    def engine_work(self) -> int | None:
        return None

    def progress(self) -> str | None:
        return None

    def cancel(self) -> None:
        if self.session is not None:
            self.session.interruptAll()

    def stop(self) -> None:
        """Release this session on the server; the server is not ours to stop."""
        if self.session is not None:
            try:
                self.session.stop()
            except Exception as exc:  # a server that went away: nothing left to release
                log.debug("spark connect session stop: %s", exc)
            self.session = None
