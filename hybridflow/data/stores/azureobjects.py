"""The object-store operations of a workdir in Azure Blob Storage (objectstore.ObjectStore's, for
az://), through azure-storage-blob: small JSON blobs written with Put Blob's conditions, trees of
files uploaded and downloaded, prefixes listed and deleted.

`If-None-Match: *` writes only if the blob is absent, `If-Match: <ETag>` only if it is unchanged; a
failed condition is HTTP 412 (409 for a create over an existing blob). The client retries requests
whose answer was lost, so a conditional write can meet its own earlier write (objectstore.ObjectStore
tells the two apart, for every store).
"""

from __future__ import annotations

import functools
import time
from datetime import timedelta
from pathlib import Path

from ...errors import DataError, HybridflowError, StorageError, UnavailableError, store_error
from ...installing import install_extras
from .. import untrusted
from ..objectstore import Conflict, ObjectStore, in_parallel, store_age
from .azure import HINT, AzurePath, AzureSettings

_TIMEOUTS = {"connection_timeout": 10, "read_timeout": 60}  # seconds to connect, to read an answer


class AzureObjectStore(ObjectStore):
    wrong_tag = '"0x8D000000000000F"'  # an ETag no blob has (Azure's are the blob's write time, in hex)

    def __init__(self, settings: AzureSettings) -> None:
        try:  # before any method imports from it
            import azure.storage.blob  # noqa: F401
        except ImportError:
            raise UnavailableError("a workdir in Azure Blob Storage needs azure-storage-blob, which is not installed",
                                   hint=install_extras("azure")) from None
        self.settings = settings
        self.filesystem = settings.arrow_filesystem()

    @functools.cached_property
    def _service(self):
        from azure.storage.blob import BlobServiceClient, LinearRetry

        # every method: a write is conditional or idempotent, and a repeat that meets itself is recognised;
        # a store that stopped answering fails a run in seconds (the library's default waits minutes)
        retry = LinearRetry(backoff=0.5, random_jitter_range=0.25, retry_total=3)
        found = self.settings.credential()
        credential = {"account_name": self.settings.account, "account_key": found.secret} if found.kind == "key" \
            else found.secret  # a shared access signature, as the library takes it
        return BlobServiceClient(self.settings.endpoint, credential=credential, retry_policy=retry, **_TIMEOUTS)

    def _blob(self, path: AzurePath):
        return self._service.get_blob_client(path.bucket, _key(path))

    # small JSON blobs, written conditionally

    def _put(self, path: AzurePath, body: bytes, create_only: bool, if_match: str | None) -> str:
        from azure.core import MatchConditions
        from azure.storage.blob import ContentSettings

        # overwrite=False is If-None-Match: * (the library adds it when no other condition is given)
        condition = ({"overwrite": False} if create_only else
                     {"overwrite": True, "etag": if_match, "match_condition": MatchConditions.IfNotModified}
                     if if_match else {"overwrite": True})
        answer = self._call(path, lambda: self._blob(path).upload_blob(
            body, content_settings=ContentSettings(content_type="application/json"), **condition), conflicts=True)
        return answer["etag"]

    def _read_bytes(self, path: AzurePath) -> tuple[bytes | None, str | None]:
        try:
            download = self._call(path, lambda: self._blob(path).download_blob(), missing=True)
            return self._call(path, download.readall), download.properties.etag
        except _Missing:
            return None, None

    def _properties(self, path: AzurePath, answered: list | None = None):
        """The blob's properties (None when there is no such blob); the answer's headers go to `answered`."""
        hook = {"raw_response_hook": lambda response: answered.append(response.http_response.headers)} \
            if answered is not None else {}
        try:
            return self._call(path, lambda: self._blob(path).get_blob_properties(**hook), missing=True)
        except _Missing:
            return None

    def exists(self, path: AzurePath) -> bool:
        return self._properties(path) is not None

    def age(self, path: AzurePath) -> float | None:
        """Seconds since the blob was last written, by the store's own clock (its answer's Date less the
        blob's Last-Modified); None when the blob is gone or the answer does not say."""
        answered: list = []
        properties = self._properties(path, answered)
        if properties is None or not answered or properties.last_modified is None:
            return None
        return store_age(properties.last_modified, answered[-1].get("Date"))

    def delete(self, path: AzurePath, if_match: str | None = None) -> None:
        from azure.core import MatchConditions

        condition = {"etag": if_match, "match_condition": MatchConditions.IfNotModified} if if_match else {}
        try:
            self._call(path, lambda: self._blob(path).delete_blob(**condition), missing=True, conflicts=bool(if_match))
        except _Missing:
            pass

    # trees of files

    def upload(self, local: Path, remote: AzurePath) -> None:
        """Every file under `local` to the same relative place under `remote`, in parallel (large
        files in blocks, which the library commits once all are up)."""
        def send(file: Path) -> None:
            with open(file, "rb") as source:
                self._blob(remote / file.relative_to(local).as_posix()).upload_blob(source, overwrite=True)

        self._each(sorted(p for p in local.rglob("*") if p.is_file()), send, remote)

    def download(self, remote_files: list[AzurePath], remote: AzurePath, local: Path) -> None:
        """Each of `remote_files` (under `remote`) to the same relative place under `local`."""
        def fetch(file: AzurePath) -> None:
            # a key holding '..' (the container is anyone's to write) must not reach outside `local`
            target = local / untrusted.relative_file(file.relative_to(remote).as_posix(), remote.uri)
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as out:
                self._blob(file).download_blob().readinto(out)

        self._each(remote_files, fetch, remote)

    def _each(self, items: list, action, where: AzurePath) -> None:
        in_parallel(items, lambda item: self._call(where, lambda: action(item)),
                    lambda exc: store_error(exc, where.uri))

    def text(self, path: AzurePath) -> str | None:
        body, _ = self._read_bytes(path)
        return None if body is None else body.decode("utf-8")

    def children(self, prefix: AzurePath) -> list[str]:
        """The names one level below `prefix` (its "folders" and blobs)."""
        container = self._service.get_container_client(prefix.bucket)
        found = self._call(prefix, lambda: list(container.walk_blobs(name_starts_with=_key(prefix) + "/" if
                                                                     _key(prefix) else None, delimiter="/")))
        return sorted({item.name.rstrip("/").rsplit("/", 1)[-1] for item in found} - {""})

    def files(self, prefix: AzurePath) -> list[AzurePath]:
        return [path for path, _, _ in self.listing(prefix)]

    def listing(self, prefix: AzurePath) -> list[tuple[AzurePath, int, str]]:
        """(blob, size, ETag) of every blob under `prefix`, at any depth, sorted."""
        return sorted((AzurePath(f"{prefix.bucket}/{blob.name}"), blob.size, blob.etag.strip('"'))
                      for blob in self._blobs(prefix) if not blob.name.endswith("/"))

    def seconds_since_written(self, prefix: AzurePath) -> float | None:
        """How long ago the newest blob under `prefix` was written, by the store's own clock."""
        answered: list = []
        blobs = self._blobs(prefix, answered)
        said = answered[-1].get("Date") if answered else None
        ages = [store_age(blob.last_modified, said) for blob in blobs]
        return min(ages) if ages else None

    def _blobs(self, prefix: AzurePath, answered: list | None = None) -> list:
        container = self._service.get_container_client(prefix.bucket)
        hook = {"raw_response_hook": lambda response: answered.append(response.http_response.headers)} \
            if answered is not None else {}
        return self._call(prefix, lambda: list(container.list_blobs(name_starts_with=_key(prefix) + "/", **hook)))

    def copy(self, pairs: list[tuple[AzurePath, AzurePath]], where: AzurePath) -> None:
        """Copy blobs inside the account (source, target), in parallel: the data never leaves it."""
        self._each(pairs, lambda pair: self._copy(*pair), where)

    def _copy(self, source: AzurePath, target: AzurePath) -> None:
        blob = self._blob(target)
        copying = blob.start_copy_from_url(self._blob(source).url)
        status = copying.get("copy_status")
        while status == "pending":  # a large blob is copied in the background: wait for it
            time.sleep(0.5)
            status = blob.get_blob_properties().copy.status
        if status != "success":
            raise StorageError(f"copying {source.uri} to {target.uri} ended '{status}'")

    def delete_all(self, paths: list[AzurePath], where: AzurePath) -> None:
        """Delete the blobs (in parallel); one that fails raises, never taken as done."""
        self._each(paths, self.delete, where)

    def abort_uploads(self, prefix: AzurePath, older_than: timedelta | None = None, quiet: bool = False) -> int:
        """Nothing to abort: blocks never committed are not a blob, and Azure drops them within a week."""
        return 0

    def delete_tree(self, prefix: AzurePath) -> None:
        """Every blob under `prefix`."""
        self.delete_all(self.files(prefix), prefix)

    # errors

    def _call(self, path: AzurePath, action, *, missing: bool = False, conflicts: bool = False):
        """`action()`, its failure as one line naming the URI (never the request's headers nor the
        key); `missing`: a blob that does not exist raises _Missing; `conflicts`: a failed condition
        raises Conflict."""
        from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError

        try:
            return action()
        except HybridflowError:
            raise
        except (ServiceRequestError, ServiceResponseError) as exc:
            raise UnavailableError(f"the object store does not answer for {path.uri}: {type(exc).__name__}",
                                   hint="check AZURE_STORAGE_CONNECTION_STRING's BlobEndpoint (or storage: "
                                        "endpoint) and that the store is up") from None
        except HttpResponseError as exc:
            code = getattr(exc, "error_code", None)
            code, status = getattr(code, "value", code), getattr(exc, "status_code", None)  # an enum, or text
            if code == "ContainerNotFound":
                raise DataError(f"the container '{path.bucket}' of {path.uri} does not exist",
                                hint="create it, or correct the URI (and the endpoint, if it is not Azure's)") from None
            if missing and status == 404:
                raise _Missing from None
            if conflicts and status in (404, 409, 412):  # If-Match on a blob that is gone fails too
                raise Conflict(path.uri) from None
            if status in (401, 403):
                raise StorageError(f"Azure Blob Storage refused access to {path.uri} ({status}: {code})",
                                   hint=HINT) from None
            raise StorageError(f"the object store failed for {path.uri}: {status} {code}") from None
        except OSError as exc:  # a local file's
            raise store_error(exc, path.uri) from exc


class _Missing(Exception):
    """No such blob."""


def _key(path: AzurePath) -> str:
    return "/".join(path.parts[1:])
