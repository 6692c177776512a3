"""A real Google Cloud Storage emulator for tests: fake-gcs-server (Go, BSD-2-Clause), one process on
127.0.0.1 serving plain http with its objects in memory, started and stopped by pid, and the one
variable that points hybridflow and every engine at it (STORAGE_EMULATOR_HOST). It honours GCS's
generation preconditions (ifGenerationMatch) on uploads, which a workdir's commits and lease are.

The binary is built once from the Go module proxy into ~/.cache/hybridflow/tools (under a minute on
two cores, then nothing): `python -m tests.support.gcsserver` does it, and .ci/run calls that. Where
it is not built (no Go toolchain), tests on this store are skipped with that reason.

GcsEndpoint has the methods tests use on an S3Endpoint (bucket, put_table, put_bytes, get_bytes,
keys, env), so that a suite written for S3 runs on GCS by naming the store.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support.gotools import GoTool
from tests.support.s3server import free_port, stop_group, wait_for_port

TOOL = GoTool("fake-gcs-server", "github.com/fsouza/fake-gcs-server", "v1.56.1", "tests.support.gcsserver")
binary, missing_reason, install = TOOL.binary, TOOL.missing_reason, TOOL.install


class GcsServer:
    """fake-gcs-server, as a test's store."""

    name = "fake-gcs"
    scheme = "gs"

    def __init__(self, log: Path, host: str = "127.0.0.1") -> None:
        self.log, self.host = log, host
        self.port = free_port(host)
        self.endpoint = f"http://{host}:{self.port}"
        self.process: subprocess.Popen | None = None
        # no credentials reach an emulator: a token that must never show up stands in for S3's secret key
        self.secret_key = secrets.token_urlsafe(16)

    def start(self) -> GcsServer:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen([str(binary()), "-scheme", "http", "-host", self.host, "-port",
                                             str(self.port), "-public-host", f"{self.host}:{self.port}",
                                             "-backend", "memory", "-log-level", "warn"],
                                            stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for_port(self.process, self.host, self.port, "fake-gcs-server", self.log)
        return self

    def stop(self) -> None:
        stop_group(self.process)

    def env(self) -> dict[str, str]:
        """The standard variable for an emulator (what a user sets), and nothing of the machine's own
        Google setup."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_APPLICATION_CREDENTIALS": os.devnull}

    def filesystem(self):
        import pyarrow.fs as pafs

        return pafs.GcsFileSystem(endpoint_override=f"{self.host}:{self.port}", scheme="http", anonymous=True)

    def bucket(self, name: str) -> str:
        self._call("POST", "/storage/v1/b", json={"name": name})
        return name

    def bucket_names(self) -> list[str]:
        listed = self._call("GET", "/storage/v1/b", params={"project": "test"}).json()
        return [b["name"] for b in listed.get("items", [])]

    def put_table(self, key: str, table: pa.Table) -> None:
        """A Parquet file at gs://key (bucket/...), written by pyarrow."""
        pq.write_table(table, key, filesystem=self.filesystem())

    def put_bytes(self, key: str, data: bytes) -> None:
        bucket, _, name = key.partition("/")
        self._call("POST", f"/upload/storage/v1/b/{bucket}/o", params={"uploadType": "media", "name": name},
                   data=data)

    def get_bytes(self, key: str) -> bytes:
        bucket, _, name = key.partition("/")
        return self._call("GET", f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}", params={"alt": "media"}).content

    def keys(self, prefix: str) -> list[str]:
        bucket, _, rest = prefix.partition("/")
        found, token = [], None
        while True:
            page = self._call("GET", f"/storage/v1/b/{bucket}/o",
                              params={"prefix": rest, **({"pageToken": token} if token else {})}).json()
            found += [f"{bucket}/{item['name']}" for item in page.get("items", [])]
            token = page.get("nextPageToken")
            if not token:
                return sorted(found)

    def _call(self, method: str, path: str, **options):
        import requests

        answer = requests.request(method, self.endpoint + path, timeout=30, **options)
        answer.raise_for_status()
        return answer


if __name__ == "__main__":
    try:
        print(install())
    except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
        print(f"fake-gcs-server: not installed ({exc}); its tests will be skipped", file=sys.stderr)
        sys.exit(1)
