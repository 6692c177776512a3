"""The object-store operations of a workdir in S3 or an S3-compatible store (objectstore.ObjectStore's):
data moves through pyarrow's S3 filesystem (multipart, parallel); the conditional writes
(If-None-Match: *, If-Match: ETag), which pyarrow cannot make, through boto3. A loser of a race gets
HTTP 412 and is told so (Conflict)."""

from __future__ import annotations

import functools
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ...errors import HybridflowError, StorageError, UnavailableError, store_error
from ...installing import install_extras
from .. import untrusted
from ..objectstore import Busy, Conflict, ObjectStore, in_parallel, store_age
from ..storage import ObjectPath
from .s3 import S3Settings

# a conditional write that failed its condition, or met another one under way (S3 answers 409 then)
_CONDITION_FAILED = ("PreconditionFailed", "412")
_CONCURRENT = ("ConditionalRequestConflict", "409")


class S3ObjectStore(ObjectStore):
    wrong_tag = '"00000000000000000000000000000000"'  # the MD5 of no object a probe writes

    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        self.filesystem = settings.arrow_filesystem()

    @functools.cached_property
    def _client(self):
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise UnavailableError("a workdir in object storage needs boto3, which is not installed",
                                   hint=install_extras("s3")) from None
        config = Config(s3={"addressing_style": "path"} if self.settings.path_style else {},
                        retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10, read_timeout=60)
        self.settings.adopt_checksum_policy()
        # a session of its own: boto3's default one keeps the credentials it found first for the whole
        # process, even after the environment names others (a notebook that switches accounts)
        client = boto3.session.Session().client("s3", endpoint_url=self.settings.endpoint,
                                                region_name=self.settings.region, config=config)
        if self.settings.endpoint:
            # botocore sends a batch delete's required checksum as CRC32 only; stores that predate
            # flexible checksums require Content-MD5 there (and AWS takes both)
            client.meta.events.register("before-sign.s3.DeleteObjects", _with_content_md5)
        return client

    # small JSON objects, written conditionally

    def _put(self, path: ObjectPath, body: bytes, create_only: bool, if_match: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if create_only else {"IfMatch": if_match} if if_match else {}
        try:
            answer = self._client.put_object(Bucket=path.bucket, Key=_key(path), ContentType="application/json",
                                             Body=body, **condition)
        except Exception as exc:  # botocore's errors, all of them, are mapped here
            code = _code(exc)
            if code in _CONCURRENT:
                raise Busy(path.uri) from exc
            # If-Match on an object that is gone: S3 answers 404, which fails the condition too
            if code in _CONDITION_FAILED or (if_match and code in ("NoSuchKey", "404")):
                raise Conflict(path.uri) from exc
            raise self._error(exc, path) from exc
        return answer["ETag"]

    def _read_bytes(self, path: ObjectPath) -> tuple[bytes | None, str | None]:
        """(the object's bytes, its ETag), or (None, None) when there is no such object."""
        try:
            answer = self._client.get_object(Bucket=path.bucket, Key=_key(path))
        except Exception as exc:  # botocore's errors, all of them, are mapped below
            if _code(exc) in ("NoSuchKey", "404"):
                return None, None
            raise self._error(exc, path) from exc
        return answer["Body"].read(), answer["ETag"]

    def exists(self, path: ObjectPath) -> bool:
        try:
            self._client.head_object(Bucket=path.bucket, Key=_key(path))
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404", "NotFound"):
                return False
            raise self._error(exc, path) from exc
        return True

    def age(self, path: ObjectPath) -> float | None:
        """Seconds since the object was last written, by the store's own clock (its answer's Date
        less the object's Last-Modified): never this machine's, which may drift from the writer's.
        None when the object is gone or the store's answer does not say."""
        try:
            answer = self._client.head_object(Bucket=path.bucket, Key=_key(path))
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._error(exc, path) from exc
        said = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        written = answer.get("LastModified")
        if not said or written is None:
            return None
        try:
            return store_age(written, said)
        except (TypeError, ValueError):  # a Date header that does not parse
            return None

    def delete(self, path: ObjectPath, if_match: str | None = None) -> None:
        try:
            condition = {"IfMatch": if_match} if if_match else {}
            self._client.delete_object(Bucket=path.bucket, Key=_key(path), **condition)
        except Exception as exc:
            if _code(exc) in ("PreconditionFailed", "412"):
                raise Conflict(path.uri) from exc
            if _code(exc) not in ("NoSuchKey", "404"):
                raise self._error(exc, path) from exc

    # trees of files

    def upload(self, local: Path, remote: ObjectPath) -> None:
        """Every file under `local` to the same relative place under `remote`: in parallel, large files
        in parts, and no "directory" objects (pyarrow's copy would make one per folder)."""
        files = sorted(p for p in local.rglob("*") if p.is_file())
        try:
            self._each(files, lambda file: self._client.upload_file(
                str(file), remote.bucket, _key(remote / file.relative_to(local).as_posix())), remote)
        except BaseException:  # parts already stored are billed until aborted: `remote` is this upload's own
            self.abort_uploads(remote, quiet=True)
            raise

    def download(self, remote_files: list[ObjectPath], remote: ObjectPath, local: Path) -> None:
        """Each of `remote_files` (under `remote`) to the same relative place under `local`."""
        def fetch(file: ObjectPath) -> None:
            # a key holding '..' (the bucket is anyone's to write) must not reach outside `local`
            target = local / untrusted.relative_file(file.relative_to(remote).as_posix(), remote.uri)
            target.parent.mkdir(parents=True, exist_ok=True)
            self._client.download_file(file.bucket, _key(file), str(target))

        self._each(remote_files, fetch, remote)

    def _each(self, items: list, action, where: ObjectPath) -> None:
        in_parallel(items, action, lambda exc: self._error(exc, where))  # botocore's and boto3's errors

    def text(self, path: ObjectPath) -> str | None:
        try:
            with self.filesystem.open_input_stream(str(path)) as stream:
                return stream.read().decode("utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise store_error(exc, path.uri) from exc

    def children(self, prefix: ObjectPath) -> list[str]:
        """The names one level below `prefix` (its "folders" and objects)."""
        names: set[str] = set()
        for page in self._pages(prefix, Delimiter="/"):
            names |= {p["Prefix"].rstrip("/").rsplit("/", 1)[-1] for p in page.get("CommonPrefixes", [])}
            names |= {o["Key"].rsplit("/", 1)[-1] for o in page.get("Contents", [])}
        return sorted(name for name in names if name)

    def files(self, prefix: ObjectPath) -> list[ObjectPath]:
        """Every object under `prefix`, at any depth."""
        return [path for path, _, _ in self.listing(prefix)]

    def listing(self, prefix: ObjectPath) -> list[tuple[ObjectPath, int, str]]:
        """(object, size, ETag) of every object under `prefix`, at any depth, sorted: what a listing
        says of each object, so that describing what an engine wrote costs no request per file."""
        return sorted((type(prefix)(f"{prefix.bucket}/{o['Key']}"), o["Size"], o["ETag"].strip('"'))
                      for page in self._pages(prefix) for o in page.get("Contents", [])
                      if not o["Key"].endswith("/"))

    def seconds_since_written(self, prefix: ObjectPath) -> float | None:
        """How long ago the newest object under `prefix` was written, by the store's own clock (its
        LastModified against the Date of its answer: no other machine's clock is compared); None when
        nothing is there."""
        ages = []
        for page in self._pages(prefix):
            date = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            ages += [store_age(o["LastModified"], date) for o in page.get("Contents", [])]
        return min(ages) if ages else None

    def copy(self, pairs: list[tuple[ObjectPath, ObjectPath]], where: ObjectPath) -> None:
        """Copy objects inside the store (source, target), in parallel: the data never leaves it
        (large objects in parts)."""
        self._each(pairs, lambda pair: self._client.copy(
            {"Bucket": pair[0].bucket, "Key": _key(pair[0])}, pair[1].bucket, _key(pair[1])), where)

    def delete_all(self, paths: list[ObjectPath], where: ObjectPath) -> None:
        """Delete the objects; a batch the store answers with errors for some keys (it deletes the
        others) raises StorageError naming how many were left, never taken as done."""
        self._delete_keys([_key(p) for p in paths], where)

    def _delete_keys(self, keys: list[str], where: ObjectPath) -> None:
        failed: list[dict] = []
        for start in range(0, len(keys), 1000):  # a DeleteObjects request takes at most 1000 keys
            batch = keys[start:start + 1000]
            try:
                answer = self._client.delete_objects(Bucket=where.bucket, Delete={
                    "Objects": [{"Key": key} for key in batch], "Quiet": True})
            except Exception as exc:
                raise self._error(exc, where) from exc
            failed += [e for e in answer.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        if failed:
            first = failed[0]
            raise StorageError(f"the object store did not delete {len(failed)} of {len(keys)} objects under "
                               f"{where.uri} (s3://{where.bucket}/{first.get('Key')}: {first.get('Code')} "
                               f"{first.get('Message') or ''})".rstrip(), hint="check the credentials' delete "
                                                                               "permission and any object lock; "
                                                                               "hybridflow gc tries again")

    def abort_uploads(self, prefix: ObjectPath, older_than: timedelta | None = None, quiet: bool = False) -> int:
        """Abort the incomplete multipart uploads under `prefix` (started more than `older_than` ago):
        a writer killed mid-upload leaves its parts stored, unseen by listings, billed, forever.
        Returns how many were aborted; `quiet`: on a path that is failing already, errors are not raised."""
        cutoff = datetime.now(timezone.utc) - older_than if older_than is not None else None
        key = _key(prefix)
        aborted = 0
        try:
            for page in self._client.get_paginator("list_multipart_uploads").paginate(
                    Bucket=prefix.bucket, Prefix=f"{key}/" if key else ""):
                for upload in page.get("Uploads", []):
                    if cutoff is None or upload["Initiated"] < cutoff:
                        self._client.abort_multipart_upload(Bucket=prefix.bucket, Key=upload["Key"],
                                                            UploadId=upload["UploadId"])
                        aborted += 1
        except Exception as exc:
            if not quiet:
                raise self._error(exc, prefix) from exc
        return aborted

    def delete_tree(self, prefix: ObjectPath) -> None:
        """Every object under `prefix` (pyarrow's delete would leave a "directory" object behind)."""
        for page in self._pages(prefix):  # keys as listed: a path would lose a "directory" marker's last /
            self._delete_keys([o["Key"] for o in page.get("Contents", [])], prefix)

    def _pages(self, prefix: ObjectPath, **options):
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=prefix.bucket, Prefix=_key(prefix) + "/", **options)
            yield from pages
        except Exception as exc:
            raise self._error(exc, prefix) from exc

    def _error(self, exc: BaseException, path: ObjectPath) -> HybridflowError:
        return store_error(exc, path.uri)


def _with_content_md5(request, **_) -> None:
    import base64
    import hashlib

    body = request.body if isinstance(request.body, bytes) else (request.body or "").encode()
    request.headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()


def _key(path: ObjectPath) -> str:
    return "/".join(path.parts[1:])


def _code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    return str(code) if code is not None else str(response.get("ResponseMetadata", {}).get("HTTPStatusCode"))
