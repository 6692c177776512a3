"""Azure Blob Storage (az://container/key): engines reach it through pyarrow's AzureFileSystem (DuckDB
and Dask through fsspec's wrapper of it, Polars through its own object_store reader), and a workdir
commits through Put Blob's conditions: `If-None-Match: *` writes only if the blob is absent,
`If-Match: <ETag>` only if it was not written since.

The account and its credential come only from Azure's standard variables:
AZURE_STORAGE_CONNECTION_STRING (AccountName, AccountKey or SharedAccessSignature, BlobEndpoint;
UseDevelopmentStorage=true for a local Azurite), else AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or
AZURE_STORAGE_SAS_TOKEN (a shared access signature). `storage: endpoint` names an emulator's or another
cloud's blob endpoint. The credential is read from the environment where a client is made, never kept
in the settings, which records and messages may show. Spark has no connector for az:// here: on this
machine it reads copies hybridflow downloads and writes local staging hybridflow uploads
(data/copies.py), and a Spark cluster there is refused at validate.
"""

from __future__ import annotations

import base64
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlsplit

from ...errors import AZURE_CREDENTIALS
from ..storage import ObjectPath

CONNECTION_VARIABLE = "AZURE_STORAGE_CONNECTION_STRING"
ACCOUNT_VARIABLE, KEY_VARIABLE = "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY"
SAS_VARIABLE = "AZURE_STORAGE_SAS_TOKEN"
# Azurite's (and the old emulator's) documented account: public, the same on every machine
DEVELOPMENT_ACCOUNT = "devstoreaccount1"
DEVELOPMENT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
HINT = AZURE_CREDENTIALS  # what to set, where Azure refused or lacks the credentials


class AzurePath(ObjectPath):
    """A file or prefix in Azure Blob Storage, "container/key/..." (az://container/key)."""

    scheme = "az"


@dataclass(frozen=True)
class AzureSettings:
    """How to reach Azure Blob Storage: the account and its blob endpoint (storage: endpoint, else the
    connection string's BlobEndpoint, else Azure's own for the account). The key is never held here."""

    account: str | None = None
    # the account's blob URL: Azure's (https://ACCOUNT.blob.core.windows.net), an emulator's
    # (http://host:port/ACCOUNT) or another cloud's; always named, so that two accounts holding the same
    # container are two stores (their own local caches, their own store checks); None: no account
    endpoint: str | None = None

    label = "Azure Blob Storage"
    scheme = "az"

    @classmethod
    def of(cls, section: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> AzureSettings:
        environ = os.environ if environ is None else environ
        parts = connection_parts(environ)
        account = parts.get("AccountName") or environ.get(ACCOUNT_VARIABLE) or None
        endpoint = (section or {}).get("endpoint") or parts.get("BlobEndpoint")
        if account is None and endpoint and "://" in endpoint:  # Azure's URL names it in its host, an emulator's
            url = urlsplit(endpoint)                            # first in its path
            host = url.hostname or ""
            account = (host.split(".")[0] if ".blob." in host else url.path.strip("/").split("/")[0]) or None
        if endpoint is None and account:  # Azure's own, or another Azure cloud's (EndpointSuffix)
            suffix = parts.get("EndpointSuffix", "core.windows.net")
            endpoint = f"{parts.get('DefaultEndpointsProtocol', 'https')}://{account}.blob.{suffix}"
        return cls(account, _account_url(endpoint.rstrip("/"), account) if endpoint else None)

    def reached(self, environ: Mapping[str, str]) -> dict[str, str]:
        """Which account, at which endpoint, and from which variable: never the key, the signature or the
        connection string."""
        source = CONNECTION_VARIABLE if environ.get(CONNECTION_VARIABLE) else \
            SAS_VARIABLE if environ.get(SAS_VARIABLE) and not environ.get(KEY_VARIABLE) else ACCOUNT_VARIABLE
        return {"endpoint": self.endpoint or self.label, "account": self.account or "(none)", "credentials": source}

    def adopt_checksum_policy(self) -> None:
        """Nothing to adopt: Azure takes the checksums every client sends (S3's settings need this)."""

    def credential(self) -> Credential:
        """The account's key or shared access signature, from the environment (never kept); StorageError
        when there is neither."""
        from ...errors import StorageError

        if not self.account:
            raise StorageError("no Azure storage account to reach az:// paths", hint=HINT)
        found = credential_of(os.environ)
        if found is None:
            raise StorageError(f"no key or shared access signature for the Azure storage account '{self.account}'",
                               hint=HINT)
        if found.kind == "key":
            try:  # a key that is not base64 fails every request deep in the libraries, with no word of which
                base64.b64decode(found.secret, validate=True)
            except ValueError:
                raise StorageError(f"the key of the Azure storage account '{self.account}' is not base64 "
                                   f"(a key is copied whole from the account's Access keys)", hint=HINT) from None
        return found

    def arrow_filesystem(self):
        """pyarrow's AzureFileSystem for these settings, made once per account key."""
        return _arrow_filesystem(self, self.credential())

    def fsspec_filesystem(self):
        """The same filesystem through fsspec's interface, answering to az:// (DuckDB routes by it)."""
        from .azurefsspec import AzureArrowWrapper

        return AzureArrowWrapper(self.arrow_filesystem())

    def objects(self):
        """The store client a workdir here commits through."""
        from .azureobjects import AzureObjectStore

        return AzureObjectStore(self)


def connection_parts(environ: Mapping[str, str]) -> dict[str, str]:
    """AZURE_STORAGE_CONNECTION_STRING's fields (Name=value;...); UseDevelopmentStorage=true as the
    fields it stands for (Azurite on this machine, its documented account)."""
    parts = dict(field.split("=", 1) for field in environ.get(CONNECTION_VARIABLE, "").split(";") if "=" in field)
    if parts.get("UseDevelopmentStorage", "").lower() == "true":
        parts = {"AccountName": DEVELOPMENT_ACCOUNT, "AccountKey": DEVELOPMENT_KEY,
                 "BlobEndpoint": f"http://127.0.0.1:10000/{DEVELOPMENT_ACCOUNT}", **parts}
    return parts


@dataclass(frozen=True)
class Credential:
    """An account key ("key") or a shared access signature ("sas", without its leading '?'): a secret,
    shown nowhere."""

    kind: str
    secret: str = field(repr=False)


def credential_of(environ: Mapping[str, str]) -> Credential | None:
    """The connection string's key or signature, else AZURE_STORAGE_KEY's, else AZURE_STORAGE_SAS_TOKEN's."""
    parts = connection_parts(environ)
    if parts.get("AccountKey"):
        return Credential("key", parts["AccountKey"])
    if parts.get("SharedAccessSignature"):
        return Credential("sas", parts["SharedAccessSignature"].lstrip("?"))
    if environ.get(KEY_VARIABLE):
        return Credential("key", environ[KEY_VARIABLE])
    if environ.get(SAS_VARIABLE):
        return Credential("sas", environ[SAS_VARIABLE].lstrip("?"))
    return None


def _account_url(endpoint: str, account: str | None) -> str:
    """An endpoint as the URL of the account's blob service: an emulator's names the account first in
    its path (http://127.0.0.1:10000/account), which `storage: endpoint` may leave out."""
    url = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    named_by_host = account and (url.hostname or "").startswith(f"{account}.")
    if account and not named_by_host and not url.path.strip("/"):
        return f"{url.scheme}://{url.netloc}/{account}"
    return f"{url.scheme}://{url.netloc}{url.path}".rstrip("/")


@functools.lru_cache(maxsize=4)
def _arrow_filesystem(settings: AzureSettings, credential: Credential):
    from .azurearrow import AzureArrowFileSystem

    options: dict[str, Any] = {}
    if settings.endpoint:
        url = urlsplit(settings.endpoint)
        # pyarrow names the account in the host (".blob.core.chinacloudapi.cn") or, for any other
        # authority (an emulator's), first in the path
        host = url.netloc
        if host.startswith(f"{settings.account}."):
            host = host[len(settings.account):]
        options.update(blob_storage_authority=host, blob_storage_scheme=url.scheme,
                       dfs_storage_authority=host.replace(".blob.", ".dfs."), dfs_storage_scheme=url.scheme)
    # pyarrow appends a signature to each request's URL as given: it must bring its own '?'
    secret = {"account_key": credential.secret} if credential.kind == "key" else {"sas_token": f"?{credential.secret}"}
    filesystem = AzureArrowFileSystem(settings.account, **secret, **options)
    filesystem.settings = settings
    return filesystem


PATH = AzurePath
SETTINGS = AzureSettings
