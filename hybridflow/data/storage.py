"""Where data lives when it is not on this machine's disk: object storage, named by URIs whose scheme
picks the store (s3:// for S3 and S3-compatible stores, gs:// for Google Cloud Storage, az:// for
Azure Blob Storage: data/stores/).

A file in object storage is an ObjectPath ("bucket/key", pyarrow's spelling, which knows its scheme);
a local file stays a pathlib.Path. The helpers here take either, with the filesystem to reach an
ObjectPath, so that the code above them has one path for both: list a dataset's files, tell a file
from a prefix, open a file, and name a file's content (size and ETag: a remote file is never read to
fingerprint it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePath, PurePosixPath
from typing import Any, Mapping

from . import stores

# what a path written as a URI looks like: a scheme, a colon, then a slash or nothing (not C:\ nor a:b)
_URI_LIKE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(/*)(.*)$", re.DOTALL)


class ObjectPath(PurePosixPath):
    """A file or prefix in S3, as "bucket/key/..."; paths derived from it (/, parent) are ObjectPaths
    too. Another store's paths are a subclass naming its scheme (stores.gcs.GcsPath)."""

    scheme = "s3"

    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self}"

    @property
    def bucket(self) -> str:
        return self.parts[0]


def is_object_uri(text: str | os.PathLike | None) -> bool:
    return isinstance(text, str) and stores.kind_of(text) is not None


def scheme_problem(text: str | os.PathLike | None) -> str | None:
    """What is wrong with the scheme of a path written as a URI (None: a store's URI, or a local path):
    `S3://`, `s3:/bucket`, `s3a://`, `gcs://` or `file:/x` would otherwise be a local folder named
    after it, and two hosts would each keep a workdir (and a lock) of their own."""
    found = _URI_LIKE.match(text) if isinstance(text, str) else None
    if found is None or is_object_uri(text):
        return None
    scheme, slashes, rest = found.groups()
    meant = stores.meant_by(scheme)
    if not slashes and meant is None:
        return None  # a local name holding a colon ("raw:2024")
    if meant is not None:
        # abfs://container@account.dfs.core.windows.net/x: the account is the store's setting, not the URI's
        rest = re.sub(r"^([^/@]+)@[^/]*", r"\1", rest.lstrip("/"))
        return f"'{text}' is not an {meant.scheme}:// URI (did you mean '{meant.scheme}://{rest}'?)"
    if scheme.lower() == "file":
        return f"'{text}' is a file: URI; write the path itself (did you mean '/{rest.lstrip('/')}'?)"
    return (f"'{text}': the scheme {scheme}:// is not supported; object storage is named s3://BUCKET/PREFIX "
            "(any S3-compatible store, through storage: endpoint), gs://BUCKET/PREFIX (Google Cloud Storage) or "
            "az://CONTAINER/PREFIX (Azure Blob Storage)")


def object_path(uri: str) -> ObjectPath:
    """scheme://bucket/key as the ObjectPath of that scheme's store."""
    scheme, rest = uri.split("://", 1)
    if not rest.strip("/") or rest.startswith("/"):
        raise ValueError(f"'{uri}' names no bucket (write {scheme}://BUCKET/PREFIX)")
    return stores.kind_of(uri).path_type()(rest.strip("/"))


def uri_of(path: PurePath) -> str:
    """How engines that take URIs (Polars, DuckDB) name a file: scheme://bucket/key, or the local path."""
    return path.uri if isinstance(path, ObjectPath) else str(path)


def settings_for(uri_or_path: str | PurePath, section: Mapping[str, Any] | None = None,
                 environ: Mapping[str, str] | None = None) -> stores.Settings:
    """How to reach the store of an object-storage URI or ObjectPath: its store's settings (S3's:
    stores.s3.S3Settings), from the pipeline's storage: section over that store's standard variables."""
    uri = uri_or_path.uri if isinstance(uri_or_path, ObjectPath) else uri_or_path
    return stores.kind_of(uri).settings_type().of(section, environ)


# -- files, local or in object storage; `filesystem` is None for local paths

def is_dir(path: PurePath, filesystem=None) -> bool:
    if not isinstance(path, ObjectPath):
        return Path(path).is_dir()
    import pyarrow.fs as pafs

    return _info(path, filesystem).type == pafs.FileType.Directory


def exists(path: PurePath, filesystem=None) -> bool:
    if not isinstance(path, ObjectPath):
        return Path(path).exists()
    import pyarrow.fs as pafs

    return _info(path, filesystem).type != pafs.FileType.NotFound


def files_under(path: PurePath, filesystem=None) -> list[PurePath]:
    """Every file under `path` (itself, when it is a file), sorted."""
    if not isinstance(path, ObjectPath):
        path = Path(path)
        return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    import pyarrow.fs as pafs

    info = _info(path, filesystem)
    if info.type == pafs.FileType.File:
        return [path]
    if info.type == pafs.FileType.NotFound:
        return []
    found = _call(path, lambda: filesystem.get_file_info(pafs.FileSelector(str(path), recursive=True)))
    return sorted(type(path)(i.path) for i in found if i.type == pafs.FileType.File)


def data_files(path: PurePath, filesystem=None) -> list[PurePath]:
    """A dataset's data files under `path` (itself, when it is a file), sorted: every file not named _*
    or .* at any depth below it (_SUCCESS, .crc, ...), the rule Spark and pyarrow share."""
    return [p for p in files_under(path, filesystem)
            if not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts)]


def size_of(path: PurePath, filesystem=None) -> int:
    if not isinstance(path, ObjectPath):
        return Path(path).stat().st_size
    return _info(path, filesystem).size


def open_input(path: PurePath, filesystem=None):
    """A file opened for reading (seekable): a local file object, or pyarrow's for an object."""
    if not isinstance(path, ObjectPath):
        return open(path, "rb")
    return _call(path, lambda: filesystem.open_input_file(str(path)))


def remove_file(path: PurePath, filesystem=None) -> None:
    if not isinstance(path, ObjectPath):
        Path(path).unlink()
        return
    _call(path, lambda: filesystem.delete_file(str(path)))


def move_file(source: PurePath, target: PurePath, filesystem=None) -> None:
    """A rename; in object storage, which has none, a copy inside the store and a delete."""
    if not isinstance(source, ObjectPath):
        os.replace(source, target)
        return
    _call(source, lambda: filesystem.move(str(source), str(target)))


def write_parquet(table, path: PurePath, filesystem=None) -> None:
    import pyarrow.parquet as pq

    if not isinstance(path, ObjectPath):
        pq.write_table(table, path)
        return
    _call(path, lambda: pq.write_table(table, str(path), filesystem=filesystem))


def content_tag(path: ObjectPath, filesystem) -> str:
    """What names an object's content without reading it: its ETag (an MD5 of a single-part upload,
    of the parts' MD5s otherwise), which changes whenever the object is written again."""
    with open_input(path, filesystem) as handle:
        metadata = handle.metadata()
    tag = metadata.get("ETag") or metadata.get(b"ETag") or metadata.get(b"etag")  # GCS spells it so
    if tag is None:  # a store that sends none: the size and time of the last write stand in
        return f"{metadata.get(b'Content-Length')}@{metadata.get(b'Last-Modified')}"
    return (tag.decode() if isinstance(tag, bytes) else tag).strip('"')


def _info(path: ObjectPath, filesystem):
    return _call(path, lambda: filesystem.get_file_info(str(path)))


def _call(path: ObjectPath, action):
    """An object-store call whose failure is the user's to fix (no such bucket, no permission, an
    endpoint that does not answer) raised as one line that names the URI."""
    try:
        return action()
    except OSError as exc:
        from ..errors import store_error

        raise store_error(exc, path.uri) from exc
