"""The object-store operations of a workdir in Google Cloud Storage (objectstore.ObjectStore's, for
gs://), through GCS's JSON API: small JSON objects written with generation preconditions, trees of
files uploaded and downloaded through pyarrow's GcsFileSystem, prefixes listed and deleted.

`ifGenerationMatch=0` is S3's If-None-Match: *, `ifGenerationMatch=<generation>` its If-Match; a
failed precondition is HTTP 412 (Conflict). The generation is the tag handed back and kept. Requests
that fail in transit are retried by the session, so a conditional write can meet its own earlier
write (objectstore.ObjectStore tells the two apart).
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ...errors import DataError, StorageError, UnavailableError, store_error
from ...installing import install_extras
from .. import untrusted
from ..objectstore import Conflict, ObjectStore, in_parallel, store_age
from .gcs import GcsPath, GcsSettings

_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
_TIMEOUT = (10, 60)  # seconds to connect, to read an answer
_HINT = ("set GOOGLE_APPLICATION_CREDENTIALS to a service account key allowed to use the bucket "
         "(or STORAGE_EMULATOR_HOST to an emulator)")


class GcsObjectStore(ObjectStore):
    wrong_tag = "1"  # a generation no object has (generations are microsecond timestamps)

    def __init__(self, settings: GcsSettings) -> None:
        self.settings = settings
        self.filesystem = settings.arrow_filesystem()

    @functools.cached_property
    def _session(self):
        try:
            import google.auth
            from google.auth.credentials import AnonymousCredentials
            from google.auth.exceptions import DefaultCredentialsError
            from google.auth.transport.requests import AuthorizedSession
            from requests.adapters import HTTPAdapter
            from urllib3.util.retry import Retry
        except ImportError:
            raise UnavailableError("a workdir in Google Cloud Storage needs google-auth and requests, which are not "
                                   "installed", hint=install_extras("gcs")) from None

        if self.settings.endpoint:
            credentials = AnonymousCredentials()
        else:
            try:
                credentials, _ = google.auth.default(scopes=[_SCOPE])
            except DefaultCredentialsError:
                raise StorageError("no credentials to reach Google Cloud Storage", hint=_HINT) from None
        session = AuthorizedSession(credentials)
        # every method: a write is conditional or idempotent, and a repeat that meets itself is recognised
        retry = Retry(total=3, connect=3, read=3, backoff_factor=0.2, status_forcelist=(429, 500, 502, 503, 504),
                      allowed_methods=None, raise_on_status=False)
        session.mount("http://", HTTPAdapter(max_retries=retry))
        session.mount("https://", HTTPAdapter(max_retries=retry))
        return session

    # small JSON objects, written conditionally

    def _put(self, path: GcsPath, body: bytes, create_only: bool, if_match: str | None) -> str:
        params = {"uploadType": "media", "name": _key(path)}
        if create_only or if_match:
            params["ifGenerationMatch"] = "0" if create_only else _generation(if_match)
        answer = self._request("POST", path, self._url(f"/upload/storage/v1/b/{path.bucket}/o"), params=params,
                               data=body, headers={"Content-Type": "application/json"})
        if answer.status_code == 412:
            raise Conflict(path.uri)
        self._check(answer, path)
        return str(answer.json()["generation"])

    def _read_bytes(self, path: GcsPath) -> tuple[bytes | None, str | None]:
        answer = self._request("GET", path, self._object_url(path), params={"alt": "media"})
        if answer.status_code == 404:
            return None, None
        self._check(answer, path)
        generation = answer.headers.get("x-goog-generation")
        if generation is None:  # a store that does not say it with the media: its metadata does
            generation = self._metadata(path)[0].get("generation")
        return answer.content, str(generation)

    def _metadata(self, path: GcsPath) -> tuple[dict, Any]:
        """(the object's metadata, the answer), ({}, answer) when there is no such object."""
        answer = self._request("GET", path, self._object_url(path))
        if answer.status_code == 404:
            return {}, answer
        self._check(answer, path)
        return answer.json(), answer

    def exists(self, path: GcsPath) -> bool:
        return bool(self._metadata(path)[0])

    def age(self, path: GcsPath) -> float | None:
        """Seconds since the object was last written, by the store's own clock (its answer's Date less
        the object's update time); None when the object is gone or the answer does not say."""
        metadata, answer = self._metadata(path)
        return _age(metadata.get("updated"), answer.headers.get("Date")) if metadata else None

    def delete(self, path: GcsPath, if_match: str | None = None) -> None:
        params = {"ifGenerationMatch": _generation(if_match)} if if_match else {}
        answer = self._request("DELETE", path, self._object_url(path), params=params)
        if answer.status_code == 412:
            raise Conflict(path.uri)
        if answer.status_code != 404:
            self._check(answer, path)

    # trees of files

    def upload(self, local: Path, remote: GcsPath) -> None:
        """Every file under `local` to the same relative place under `remote`, in parallel."""
        files = sorted(p for p in local.rglob("*") if p.is_file())
        self._each(files, lambda file: self._copy_file(file, remote / file.relative_to(local).as_posix()), remote)

    def _copy_file(self, file: Path, target: GcsPath) -> None:
        with open(file, "rb") as source, self.filesystem.open_output_stream(str(target)) as out:
            while chunk := source.read(8 << 20):
                out.write(chunk)

    def download(self, remote_files: list[GcsPath], remote: GcsPath, local: Path) -> None:
        """Each of `remote_files` (under `remote`) to the same relative place under `local`."""
        def fetch(file: GcsPath) -> None:
            # a key holding '..' (the bucket is anyone's to write) must not reach outside `local`
            target = local / untrusted.relative_file(file.relative_to(remote).as_posix(), remote.uri)
            target.parent.mkdir(parents=True, exist_ok=True)
            with self.filesystem.open_input_stream(str(file)) as source, open(target, "wb") as out:
                while chunk := source.read(8 << 20):
                    out.write(chunk)

        self._each(remote_files, fetch, remote)

    def _each(self, items: list, action, where: GcsPath) -> None:
        in_parallel(items, action, lambda exc: store_error(exc, where.uri))  # pyarrow's errors

    def text(self, path: GcsPath) -> str | None:
        body, _ = self._read_bytes(path)
        return None if body is None else body.decode("utf-8")

    def children(self, prefix: GcsPath) -> list[str]:
        """The names one level below `prefix` (its "folders" and objects)."""
        names: set[str] = set()
        for page in self._pages(prefix, delimiter="/"):
            names |= {p.rstrip("/").rsplit("/", 1)[-1] for p in page.get("prefixes", [])}
            names |= {o["name"].rsplit("/", 1)[-1] for o in page.get("items", [])}
        return sorted(name for name in names if name)

    def files(self, prefix: GcsPath) -> list[GcsPath]:
        return [path for path, _, _ in self.listing(prefix)]

    def listing(self, prefix: GcsPath) -> list[tuple[GcsPath, int, str]]:
        """(object, size, ETag) of every object under `prefix`, at any depth, sorted."""
        return sorted((GcsPath(f"{prefix.bucket}/{o['name']}"), int(o["size"]), o["etag"])
                      for page in self._pages(prefix) for o in page.get("items", []) if not o["name"].endswith("/"))

    def seconds_since_written(self, prefix: GcsPath) -> float | None:
        """How long ago the newest object under `prefix` was written, by the store's own clock."""
        ages = [_age(o["updated"], page["Date"]) for page in self._pages(prefix) for o in page.get("items", [])]
        return min(ages) if ages else None

    def copy(self, pairs: list[tuple[GcsPath, GcsPath]], where: GcsPath) -> None:
        """Copy objects inside the store (source, target), in parallel: the data never leaves it."""
        self._each(pairs, lambda pair: self._rewrite(*pair), where)

    def _rewrite(self, source: GcsPath, target: GcsPath) -> None:
        url = self._object_url(source) + f"/rewriteTo/b/{target.bucket}/o/{quote(_key(target), safe='')}"
        token = None
        while True:  # a large object is rewritten in several calls, each handing on a token
            answer = self._request("POST", source, url, params={"rewriteToken": token} if token else {})
            self._check(answer, source)
            done = answer.json()
            if done.get("done", True):
                return
            token = done["rewriteToken"]

    def delete_all(self, paths: list[GcsPath], where: GcsPath) -> None:
        """Delete the objects (one request each, in parallel: the JSON API's batches answer per object
        anyway); one that fails raises, never taken as done."""
        self._each(paths, self.delete, where)

    def abort_uploads(self, prefix: GcsPath, older_than: timedelta | None = None, quiet: bool = False) -> int:
        """Nothing to abort: an unfinished GCS upload stores nothing and expires by itself in a week."""
        return 0

    def delete_tree(self, prefix: GcsPath) -> None:
        """Every object under `prefix`."""
        self.delete_all(self.files(prefix), prefix)

    def _pages(self, prefix: GcsPath, **options):
        params = {"prefix": _key(prefix) + "/", **options}
        while True:
            answer = self._request("GET", prefix, self._url(f"/storage/v1/b/{prefix.bucket}/o"), params=params)
            self._check(answer, prefix)
            page = answer.json()
            yield {**page, "Date": answer.headers.get("Date")}
            if not page.get("nextPageToken"):
                return
            params = {**params, "pageToken": page["nextPageToken"]}

    # requests

    def _url(self, path: str) -> str:
        return self.settings.base_url + path

    def _object_url(self, path: GcsPath) -> str:
        return self._url(f"/storage/v1/b/{path.bucket}/o/{quote(_key(path), safe='')}")

    def _request(self, method: str, path: GcsPath, url: str, **options):
        import requests

        try:
            return self._session.request(method, url, timeout=_TIMEOUT, **options)
        except requests.RequestException as exc:
            raise UnavailableError(f"the object store does not answer for {path.uri}: {type(exc).__name__}",
                                   hint="check STORAGE_EMULATOR_HOST (or storage: endpoint) and that the store is "
                                        "up") from None

    def _check(self, answer, path: GcsPath) -> None:
        """An answer that is not a success as one line naming the URI (never the request's headers)."""
        if answer.ok:
            return
        reason = _reason(answer)
        if answer.status_code == 404:
            raise DataError(f"the bucket '{path.bucket}' of {path.uri} does not exist",
                            hint="create it, or correct the URI (and STORAGE_EMULATOR_HOST, if it is not Google "
                                 "Cloud Storage)")
        if answer.status_code in (401, 403):
            raise StorageError(f"Google Cloud Storage refused access to {path.uri} ({answer.status_code}: {reason})",
                               hint=_HINT)
        raise StorageError(f"the object store failed for {path.uri}: {answer.status_code} {reason}")


def _key(path: GcsPath) -> str:
    return "/".join(path.parts[1:])


def _generation(tag: str) -> str:
    """A generation as the JSON API takes it; a tag that is none can match no object."""
    return tag if tag.isdigit() else GcsObjectStore.wrong_tag


def _reason(answer) -> str:
    try:
        return str(answer.json()["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return answer.reason or ""


def _age(updated: str | None, said: str | None) -> float | None:
    """Seconds from an object's update time (RFC 3339, as GCS writes it) to the store's answer's Date."""
    return store_age(datetime.fromisoformat(updated.replace("Z", "+00:00")), said) if updated else None
