"""A real MLflow tracking server for tests: `mlflow server` on 127.0.0.1 with a SQLite backend store
and an artifact store it serves itself (a local folder, or a bucket of the tests' S3 server), or one
its clients write to directly (`serve=False`), in its own session, stopped by its process group's id."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


class MlflowServer:
    def __init__(self, home: Path, artifacts: str | None = None, serve: bool = True,
                 env: dict[str, str] | None = None) -> None:
        """`artifacts`: where artifacts go (default: a folder of `home`); `env`: the server's own
        variables on top of the tests' (an S3 artifact store's AWS variables)."""
        home.mkdir(parents=True, exist_ok=True)
        self.home = home
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            self.port = free.getsockname()[1]
        self.log = open(home / "server.log", "wb")
        artifacts = artifacts or str(home / "artifacts")
        where = ["--artifacts-destination", artifacts] if serve else \
            ["--no-serve-artifacts", "--default-artifact-root", artifacts]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}", *where],
            cwd=home, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **(env or {})})
        self._wait_until_healthy(home)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_until_healthy(self, home: Path, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(home / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer in {seconds:.0f}s")

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def stop(self) -> None:
        """The server and its workers (its session's process group), by the id it was started with."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
