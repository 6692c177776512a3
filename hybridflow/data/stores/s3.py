"""S3 and S3-compatible stores (s3://): the settings, from the pipeline's storage: section over the
standard AWS variables and profile; the client a workdir commits through is s3objects.py.

pyarrow does not read AWS_ENDPOINT_URL by itself, and Spark reads none of the AWS variables, so they are
handed the settings' values (Spark's and Polars' through their declarations: hybridflow.engines.spark.
objectstorage, hybridflow.engines.polars). Credentials are never copied into anything an engine records
(Spark's configuration): pyarrow, boto3 and the engines read them from the environment or profile, as
the AWS SDKs do."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..storage import ObjectPath

# the AWS SDKs' shared settings for flexible checksums (boto3 and pyarrow's C++ SDK read both)
CHECKSUM_VARIABLES = ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION")


@dataclass(frozen=True)
class S3Settings:
    """How to reach S3: the pipeline's storage: section over the AWS variables."""

    label = "AWS S3"  # what the store is called where no endpoint names it
    scheme = "s3"

    endpoint: str | None = None  # http(s)://host:port of an S3-compatible store; None: AWS itself
    region: str | None = None
    path_style: bool | None = None  # bucket in the path, not the host name (most self-hosted stores)

    @classmethod
    def of(cls, section: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> S3Settings:
        environ = os.environ if environ is None else environ
        section = section or {}
        endpoint = section.get("endpoint") or environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
        region = section.get("region") or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
        path_style = section.get("path_style")
        if path_style is None and endpoint:  # a store other than AWS: path-style is what they all serve
            path_style = True
        return cls(endpoint.rstrip("/") if endpoint else None, region, path_style)

    def adopt_checksum_policy(self) -> None:
        """On a store other than AWS, checksums only where the S3 API requires them: boto3 and pyarrow
        otherwise send CRC32 with every write (pyarrow's parts in aws-chunked encoding with a trailer),
        which stores that predate those checksums refuse. Set in the environment, where both SDKs read
        it when a client is made, in this process and in the engines' workers it starts; a value the
        user set is kept."""
        if self.endpoint and not self.aws_endpoint:
            for name in CHECKSUM_VARIABLES:
                os.environ.setdefault(name, "when_required")

    @property
    def aws_endpoint(self) -> bool:
        """Whether the endpoint is AWS's own (a VPC or FIPS endpoint): it takes every checksum."""
        from urllib.parse import urlsplit

        host = (urlsplit(self.endpoint or "").hostname or "").lower()
        return host.endswith((".amazonaws.com", ".amazonaws.com.cn"))

    def reached(self, environ: Mapping[str, str]) -> dict[str, str]:
        """What tells the store these settings reach, and as whom, from another (doctor compares cron's
        with the shell's): never a credential."""
        return {"endpoint": self.endpoint or self.label, "region": self.region or "(none)",
                "profile": environ.get("AWS_PROFILE") or "default",
                "config file": environ.get("AWS_CONFIG_FILE") or "~/.aws/config"}

    def objects(self):
        """The store client a workdir here commits through (on boto3)."""
        from .s3objects import S3ObjectStore

        return S3ObjectStore(self)

    @property
    def plain_http(self) -> bool:
        return bool(self.endpoint) and self.endpoint.startswith("http://")

    def arrow_filesystem(self):
        """pyarrow's S3FileSystem for these settings (credentials from the environment or profile),
        made once per set of credentials: pyarrow reads them when the filesystem is made."""
        self.adopt_checksum_policy()
        return _arrow_filesystem(self, _credentials_key())

    def fsspec_filesystem(self):
        """The same filesystem through fsspec's interface, for engines that take an fsspec filesystem
        (DuckDB, whose own S3 reader is an extension it would download)."""
        from fsspec.implementations.arrow import ArrowFSWrapper

        return ArrowFSWrapper(self.arrow_filesystem())


def _credentials_key() -> str:
    """What tells one set of credentials in the environment from another (a digest: never kept)."""
    import hashlib

    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
    return hashlib.sha256("\0".join(os.environ.get(name, "") for name in names).encode()).hexdigest()


@functools.lru_cache(maxsize=4)
def _arrow_filesystem(settings: S3Settings, credentials: str):
    import pyarrow.fs as pafs

    options: dict[str, Any] = {}
    if settings.endpoint:
        options["endpoint_override"] = settings.endpoint
    if settings.region:
        options["region"] = settings.region
    if settings.path_style is False:
        options["force_virtual_addressing"] = True
    # no retries on a store that stopped answering for minutes: a run fails in seconds, with its cause
    options["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=3)
    return pafs.S3FileSystem(**options, allow_bucket_creation=False, allow_bucket_deletion=False)


PATH = ObjectPath
SETTINGS = S3Settings
