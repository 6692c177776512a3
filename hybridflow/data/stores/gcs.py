"""Google Cloud Storage (gs://): engines reach it through pyarrow's GcsFileSystem (DuckDB and Dask
through fsspec's wrapper of it, Polars through its own object_store reader), and a workdir commits
through GCS's generation preconditions: `ifGenerationMatch=0` writes only if the object is absent,
`ifGenerationMatch=<generation>` only if it was not written since. The generation is the "ETag"
hybridflow keeps.

Credentials come only from Google's standard places (GOOGLE_APPLICATION_CREDENTIALS, the gcloud
default, the metadata server), read by Google's own libraries; STORAGE_EMULATOR_HOST (or storage:
endpoint) names an emulator, reached without credentials as Google's libraries do. Spark reaches
gs:// through Google's GCS connector for Hadoop, fetched on first need (engines/spark/gcs_jar.py).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

from ..storage import ObjectPath

EMULATOR_VARIABLE = "STORAGE_EMULATOR_HOST"


class GcsPath(ObjectPath):
    """A file or prefix in Google Cloud Storage, "bucket/key/..." (gs://bucket/key)."""

    scheme = "gs"


@dataclass(frozen=True)
class GcsSettings:
    """How to reach GCS: Google's own endpoint, or an emulator's (storage: endpoint, else
    STORAGE_EMULATOR_HOST); credentials are never held here."""

    endpoint: str | None = None  # http(s)://host:port of an emulator; None: Google Cloud Storage itself
    project: str | None = None  # GOOGLE_CLOUD_PROJECT, where a client library asks for one

    label = "Google Cloud Storage"
    scheme = "gs"

    @classmethod
    def of(cls, section: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> GcsSettings:
        environ = os.environ if environ is None else environ
        endpoint = (section or {}).get("endpoint") or environ.get(EMULATOR_VARIABLE)
        if endpoint and "://" not in endpoint:  # Google's libraries take "host:port" there too
            endpoint = f"http://{endpoint}"
        return cls(endpoint.rstrip("/") if endpoint else None, environ.get("GOOGLE_CLOUD_PROJECT"))

    def reached(self, environ: Mapping[str, str]) -> dict[str, str]:
        """What tells the store these settings reach, and as whom, from another: the key file's path,
        never its content."""
        return {"endpoint": self.endpoint or self.label, "project": self.project or "(none)",
                "credentials file": environ.get("GOOGLE_APPLICATION_CREDENTIALS") or "(gcloud's default)"}

    def adopt_checksum_policy(self) -> None:
        """Nothing to adopt: GCS takes the checksums every client sends (S3's settings need this)."""

    @property
    def base_url(self) -> str:
        return self.endpoint or "https://storage.googleapis.com"

    def arrow_filesystem(self):
        """pyarrow's GcsFileSystem for these settings, made once per set of credentials."""
        return _arrow_filesystem(self, os.environ.get("GOOGLE_APPLICATION_CREDENTIALS", ""))

    def fsspec_filesystem(self):
        """The same filesystem through fsspec's interface, answering to gs:// (DuckDB routes by it)."""
        from .gcsfsspec import GcsArrowWrapper

        return GcsArrowWrapper(self.arrow_filesystem())

    def objects(self):
        """The store client a workdir here commits through."""
        from .gcsobjects import GcsObjectStore

        return GcsObjectStore(self)


@functools.lru_cache(maxsize=4)
def _arrow_filesystem(settings: GcsSettings, credentials: str):
    from datetime import timedelta

    import pyarrow.fs as pafs

    options: dict[str, Any] = {}
    if settings.endpoint:
        url = urlsplit(settings.endpoint)
        options.update(endpoint_override=url.netloc, scheme=url.scheme, anonymous=True)
    if settings.project:
        options["project_id"] = settings.project
    # a store that stopped answering fails a run in seconds, with its cause (pyarrow's default: 15 minutes)
    return pafs.GcsFileSystem(**options, retry_time_limit=timedelta(seconds=20))


PATH = GcsPath
SETTINGS = GcsSettings
