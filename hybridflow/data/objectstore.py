"""The few object-store operations a workdir in object storage is built from (ObjectStore, which each
store's client implements: data/stores/): small JSON objects written create-only or compare-and-swap,
trees of files uploaded and downloaded, prefixes listed and deleted.

Conditional writes are what make publishing atomic without a rename (object stores have none): a loser
of a race is told so (Conflict), never a silent overwrite.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ..errors import HybridflowError
from .storage import ObjectPath

_CONFLICT_TRIES = 3  # a conditional write that met another one under way is tried this many times


class Conflict(Exception):
    """A conditional write lost: the object exists (create-only) or changed (compare-and-swap)."""


class Busy(Conflict):
    """A conditional write met another one under way on the same object (S3 answers 409): worth another try."""


class ObjectStore:
    """A workdir's store client. Small JSON objects are written create-only or compare-and-swap the
    same way on every store: each store makes one conditional put (`_put`) and reads an object back
    (`_read_bytes`); the other operations are each store's own.

    A store's client retries a request whose answer was lost, and the retry fails its condition
    against the write it made itself: a failed condition is a lost race only when the object now
    holds something else. Callers make what they write unique (a run id, a nonce), so equal bytes
    mean the write was ours."""

    def _put(self, path: ObjectPath, body: bytes, create_only: bool, if_match: str | None) -> str:
        """Store `body` under the condition; its new tag. Raises Conflict when the condition fails
        (Busy when another conditional write was under way)."""
        raise NotImplementedError

    def _read_bytes(self, path: ObjectPath) -> tuple[bytes | None, str | None]:
        """(the object's bytes, its tag), or (None, None) when there is no such object."""
        raise NotImplementedError

    def read_json(self, path: ObjectPath) -> tuple[Any, str | None]:
        """(the object's JSON, its tag: ETag or generation), or (None, None) when there is no such object."""
        return json_and_tag(path, *self._read_bytes(path))

    def write_json(self, path: ObjectPath, value: Any, *, create_only: bool = False,
                   if_match: str | None = None) -> str:
        """Write the object; returns its new tag. `create_only`: only if it does not exist; `if_match`:
        only if its tag is still this one. Raises Conflict when the condition fails."""
        body = json.dumps(value, indent=1, sort_keys=True).encode()
        tries = 0
        while True:
            tries += 1
            try:
                return self._put(path, body, create_only, if_match)
            except Conflict as exc:
                stored, tag = self._read_bytes(path)
                if stored == body:
                    return tag  # our own write, whose answer was lost
                if isinstance(exc, Busy) and tries < _CONFLICT_TRIES:
                    time.sleep(0.2 * tries)  # another conditional write was under way: try again
                    continue
                raise Conflict(path.uri) from exc

    # what each store's client does its own way

    settings: Any  # the store's settings (data.stores.Settings) it was made with
    filesystem: Any  # pyarrow's filesystem of the store, through which data files are read and written
    wrong_tag: str  # a tag no object a probe writes has (store/storecheck.py)

    def exists(self, path: ObjectPath) -> bool:
        raise NotImplementedError

    def age(self, path: ObjectPath) -> float | None:
        """Seconds since the object was last written, by the store's own clock; None when it is gone or
        the store's answer does not say."""
        raise NotImplementedError

    def delete(self, path: ObjectPath, if_match: str | None = None) -> None:
        """Delete the object (only if its tag is still `if_match`: else Conflict); gone already is done."""
        raise NotImplementedError

    def upload(self, local: Path, remote: ObjectPath) -> None:
        """Every file under `local` to the same relative place under `remote`."""
        raise NotImplementedError

    def download(self, remote_files: list[ObjectPath], remote: ObjectPath, local: Path) -> None:
        """Each of `remote_files` (under `remote`) to the same relative place under `local`, never outside it."""
        raise NotImplementedError

    def text(self, path: ObjectPath) -> str | None:
        raise NotImplementedError

    def children(self, prefix: ObjectPath) -> list[str]:
        """The names one level below `prefix` (its "folders" and objects)."""
        raise NotImplementedError

    def files(self, prefix: ObjectPath) -> list[ObjectPath]:
        """Every object under `prefix`, at any depth."""
        raise NotImplementedError

    def listing(self, prefix: ObjectPath) -> list[tuple[ObjectPath, int, str]]:
        """(object, size, tag) of every object under `prefix`, at any depth, sorted."""
        raise NotImplementedError

    def seconds_since_written(self, prefix: ObjectPath) -> float | None:
        """How long ago the newest object under `prefix` was written, by the store's own clock; None when
        nothing is there."""
        raise NotImplementedError

    def copy(self, pairs: list[tuple[ObjectPath, ObjectPath]], where: ObjectPath) -> None:
        """Copy objects inside the store (source, target): the data never leaves it."""
        raise NotImplementedError

    def delete_all(self, paths: list[ObjectPath], where: ObjectPath) -> None:
        """Delete the objects; some left undeleted raise StorageError, never taken as done."""
        raise NotImplementedError

    def abort_uploads(self, prefix: ObjectPath, older_than: timedelta | None = None, quiet: bool = False) -> int:
        """Abort the incomplete uploads under `prefix` (started more than `older_than` ago); how many."""
        raise NotImplementedError

    def delete_tree(self, prefix: ObjectPath) -> None:
        """Every object under `prefix`."""
        raise NotImplementedError


def json_and_tag(path: ObjectPath, body: bytes | None, tag: str | None) -> tuple[Any, str | None]:
    """A small object's JSON and its tag (ETag, generation), from its bytes; (None, None) when absent."""
    if body is None:
        return None, None
    try:
        return json.loads(body), tag
    except ValueError as exc:
        raise HybridflowError(f"{path.uri} is not JSON: {exc}") from exc


def in_parallel(items: list, action, failed) -> None:
    """`action(item)` for every item, eight at a time (the time of many small requests is their wait);
    the first failure is raised: a HybridflowError as it is, any other as `failed(exc)` makes it."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8) as pool:
        for future in [pool.submit(action, item) for item in items]:
            try:
                future.result()
            except HybridflowError:
                raise
            except Exception as exc:  # the store library's own
                raise failed(exc) from exc


def store_age(written: datetime, said: str | None) -> float:
    """Seconds from an object's last write to the store's answer's Date header: one clock, the store's,
    never this machine's (which may drift from the writer's); this machine's only where the store
    sends no Date, which every grace it is compared with dwarfs."""
    from email.utils import parsedate_to_datetime

    now = parsedate_to_datetime(said) if said else datetime.now(timezone.utc)
    return max(0.0, (now - written).total_seconds())
