"""A real Azure Blob Storage emulator for tests: Azurite (npm, MIT), its blob service alone, one process
on 127.0.0.1 serving plain http with its blobs in memory, started and stopped by pid, with an account
and key made for the run (AZURITE_ACCOUNTS; Azurite's well-known development account is then off), and
the standard variable that points hybridflow and every engine at it (AZURE_STORAGE_CONNECTION_STRING).
It honours Azure's conditional writes (If-None-Match: *, If-Match: ETag) on Put Blob.

Azurite is installed once from the npm registry into ~/.cache/hybridflow/tools (about 30 s, then
nothing): `python -m tests.support.azurite` does it, and .ci/run calls that. Where it is not installed
(no npm), tests on this store are skipped with that reason.

AzuriteServer has the methods tests use on an S3Endpoint (bucket, put_table, put_bytes, get_bytes, keys,
bucket_names, env), so that a suite written for S3 runs on Azure by naming the store (a bucket is a
container).
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support.gotools import CACHE_VARIABLE
from tests.support.s3server import free_port, stop_group, wait_for_port

VERSION = "3.37.0"


def home() -> Path:
    root = Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "hybridflow" / "tools")
    return root / f"azurite-{VERSION}"


def binary() -> Path:
    return home() / "node_modules" / ".bin" / "azurite-blob"


def missing_reason() -> str | None:
    """Why Azurite cannot run here (None: it can)."""
    if binary().is_file() and shutil.which("node"):
        return None
    return f"Azurite {VERSION} is not installed at {home()} (run: python -m tests.support.azurite; needs npm)"


def install() -> Path:
    """npm install of the pinned version unless it is there (idempotent); put in place only once whole."""
    if binary().is_file():
        return binary()
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed: Azurite cannot be installed")
    home().parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home().parent) as scratch:
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", scratch,
                        f"azurite@{VERSION}"], check=True, stdout=subprocess.DEVNULL, timeout=600)
        shutil.rmtree(home(), ignore_errors=True)  # what an install cut short left
        os.replace(scratch, home())
        os.mkdir(scratch)  # for TemporaryDirectory's own clean-up
    return binary()


class AzuriteServer:
    """Azurite's blob service, as a test's store."""

    name = "azurite"
    scheme = "az"

    def __init__(self, log: Path, host: str = "127.0.0.1") -> None:
        self.log, self.host = log, host
        self.port = free_port(host)
        self.account = "hf" + secrets.token_hex(4)
        self.endpoint = f"http://{host}:{self.port}/{self.account}"  # Azurite's URLs name the account first
        self.secret_key = base64.b64encode(secrets.token_bytes(32)).decode()
        self.process: subprocess.Popen | None = None

    def start(self) -> AzuriteServer:
        env = {**os.environ, "AZURITE_ACCOUNTS": f"{self.account}:{self.secret_key}"}
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [str(binary()), "--blobHost", self.host, "--blobPort", str(self.port), "--inMemoryPersistence",
                 "--skipApiVersionCheck", "--disableTelemetry", "--silent", "--extentMemoryLimit", "512"],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        wait_for_port(self.process, self.host, self.port, "Azurite", self.log)
        return self

    def stop(self) -> None:
        stop_group(self.process)

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={self.account};AccountKey={self.secret_key};"
                f"BlobEndpoint={self.endpoint};")

    def env(self) -> dict[str, str]:
        """The standard variable a user sets (the connection string), and nothing of the machine's own
        Azure setup."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string, "AZURE_STORAGE_ACCOUNT": "",
                "AZURE_STORAGE_KEY": ""}

    def service(self):
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def filesystem(self):
        import pyarrow.fs as pafs

        return pafs.AzureFileSystem(account_name=self.account, account_key=self.secret_key,
                                    blob_storage_authority=f"{self.host}:{self.port}", blob_storage_scheme="http",
                                    dfs_storage_authority=f"{self.host}:{self.port}", dfs_storage_scheme="http")

    def bucket(self, name: str) -> str:
        self.service().create_container(name)
        return name

    def bucket_names(self) -> list[str]:
        return [c.name for c in self.service().list_containers()]

    def put_table(self, key: str, table: pa.Table) -> None:
        """A Parquet file at az://key (container/...), written by pyarrow."""
        pq.write_table(table, key, filesystem=self.filesystem())

    def put_bytes(self, key: str, data: bytes) -> None:
        container, _, name = key.partition("/")
        self.service().get_blob_client(container, name).upload_blob(data, overwrite=True)

    def get_bytes(self, key: str) -> bytes:
        container, _, name = key.partition("/")
        return self.service().get_blob_client(container, name).download_blob().readall()

    def keys(self, prefix: str) -> list[str]:
        container, _, rest = prefix.partition("/")
        blobs = self.service().get_container_client(container).list_blobs(name_starts_with=rest or None)
        return sorted(f"{container}/{blob.name}" for blob in blobs)


if __name__ == "__main__":
    try:
        print(install())
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        print(f"Azurite: not installed ({exc}); its tests will be skipped", file=sys.stderr)
        sys.exit(1)
