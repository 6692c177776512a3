"""Content hashes of files, remembered by their stat so unchanged raw data is not re-read.

Published versions carry their files' sha256 in their manifests; this cache serves external inputs,
which hybridflow does not own: a file is hashed again when its size, mtime, ctime, inode or device
changed. A workdir's cache is backed by the machine's (data/localcache.py): a fresh workdir, or another
pipeline reading the same raw files, does not read gigabytes again to learn what this machine knows.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import time
from pathlib import Path, PurePath

from .localcache import write_private
from .storage import ObjectPath, content_tag

RECENT_NS = 2 * 10**9  # coarse file system timestamps: a change within this window may not show
MACHINE_ENTRIES = 20_000  # files the machine's cache remembers: about 4 MB, read only when a workdir's misses


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


CHUNK = 4 * 2**20


def file_digests(path: Path, metadata=None) -> tuple[str, str]:
    """(sha256 of the file's bytes, digest of its data), in one read. For Parquet the data digest
    covers the pages, the row count and the schema but not the footer's other metadata: writers put
    their name, version and encoding lists there in an order that changes from run to run (Spark's
    do), so the same rows written twice keep one data digest and do not rerun what reads them.
    `metadata`: the file's Parquet footer when the caller has read it already."""
    whole = hashlib.sha256()
    data_end, summary = _parquet_data_end(path, metadata)
    data = hashlib.sha256(summary.encode()) if summary is not None else None
    done = 0
    with open(path, "rb") as handle, _Beside() as beside:
        while chunk := handle.read(CHUNK):
            if data is not None and done < data_end:
                beside.update(data, chunk[:data_end - done])  # both digests at once, on two cores
            whole.update(chunk)
            beside.wait()
            done += len(chunk)
    return whole.hexdigest(), (data.hexdigest() if data is not None else whole.hexdigest())


class _Beside:
    """A second hash updated in a thread while this one updates the first (hashlib lets go of the GIL
    on large buffers): two passes over a published file in the time of one."""

    def __init__(self) -> None:
        self._pool = None
        self._pending = None

    def __enter__(self) -> _Beside:
        return self

    def update(self, digest, chunk: bytes) -> None:
        if len(chunk) < SIDE_BY_SIDE:  # a thread is not worth it for a small file
            digest.update(chunk)
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="hybridflow-digest")
        self._pending = self._pool.submit(digest.update, chunk)

    def wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def __exit__(self, *exc_info) -> None:
        self.wait()
        if self._pool is not None:
            self._pool.shutdown()


SIDE_BY_SIDE = 2**20


def _parquet_data_end(path: Path, metadata=None) -> tuple[int, str | None]:
    """Where a Parquet file's footer starts, and its row count and schema in words; (0, None) for a
    file that is not Parquet."""
    if path.suffix != ".parquet":
        return 0, None
    from .contract import standard_schema

    if metadata is None:
        import pyarrow.parquet as pq

        try:
            metadata = pq.read_metadata(path)
        except Exception:  # not readable as Parquet: its bytes are its content
            return 0, None
    schema = standard_schema(metadata.schema.to_arrow_schema().remove_metadata())
    # the file ends with the footer, its 4-byte length and PAR1
    return path.stat().st_size - 8 - metadata.serialized_size, f"{metadata.num_rows}\n{schema}\n"


def digest_of(items) -> str:
    """One sha256 over (name, hash) pairs, independent of the order they come in."""
    digest = hashlib.sha256()
    for name, value in sorted(items):
        digest.update(f"{name}\0{value}\n".encode())
    return digest.hexdigest()


def _stamp(stat: os.stat_result) -> list[int]:
    # ctime changes on any write or metadata change and cannot be set back (unlike mtime, which
    # cp -p, touch -r or rsync -t restore)
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev]


def _sha256_or_none(file: Path) -> str | None:
    try:
        return file_sha256(file)
    except OSError:
        return None


class HashCache:
    """sha256 of files by path, trusted while the file's size, mtime and inode are unchanged.

    A path may hold a value from ${env:...} (raw/${env:TENANT}/events.parquet), so the file keeps no
    path: entries are keyed by an HMAC of the path under a random key of this cache, and the file is
    the owner's only (0600). A cache written by an older version (keyed by plain paths) is dropped
    and rewritten: its files are hashed once more."""

    VERSION = 2

    def __init__(self, path: Path, shared: Path | None = None, limit: int | None = None) -> None:
        """shared: the machine's cache (opened only when this one does not know a file), asked what
        this one does not know and told what it learns. limit: the most entries kept, the least
        recently learnt dropped first (the machine's cache sees every file of every workdir)."""
        self.path = path
        self.shared_path = shared
        self.limit = limit
        self._shared: HashCache | None = None
        self._key, self._entries = self._load()
        self._learnt: set[str] = set()  # the entries this process added: kept over another's on save
        self._dirty = False
        if self._key is None:  # no cache yet, or one written by an older version: replace it, paths and all
            self._key = secrets.token_bytes(32)
            self._dirty = self.path.exists()

    def _load(self) -> tuple[bytes | None, dict[str, list]]:
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") == self.VERSION:
                return bytes.fromhex(data["key"]), dict(data["entries"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            pass
        return None, {}

    def _key_of(self, file: Path) -> str:
        return hmac.new(self._key, os.fsencode(file.resolve()), "sha256").hexdigest()

    def content(self, file: PurePath, filesystem=None) -> str:
        """What names a file's content: the sha256 of a local file, an object's ETag (never read:
        the store computed it when the object was written)."""
        if isinstance(file, ObjectPath):
            return "etag:" + content_tag(file, filesystem)
        return self.sha256(Path(file))

    def sha256(self, file: Path) -> str:
        stat = file.stat()
        known = self._recall(file, stat)
        if known is not None:
            return known
        value = file_sha256(file)
        self._learn(file, stat, value)
        return value

    def warm(self, files: list[PurePath]) -> None:
        """Hash the local files whose sha256 is not known yet side by side, one per core (hashing lets
        go of the GIL): a first run over new data waits for its largest file, not for every file one
        after another. A file that cannot be read is left to sha256(), which says so."""
        todo = []
        for file in (Path(f) for f in files if not isinstance(f, ObjectPath)):
            with contextlib.suppress(OSError):
                stat = file.stat()
                if self._recall(file, stat) is None:
                    todo.append((file, stat))
        if len(todo) < 2:
            return
        from concurrent.futures import ThreadPoolExecutor

        todo.sort(key=lambda item: -item[1].st_size)  # the largest first: the others fit beside it
        with ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1), thread_name_prefix="hybridflow-hash") as pool:
            values = list(pool.map(_sha256_or_none, [file for file, _ in todo]))
        for (file, stat), value in zip(todo, values):
            if value is not None:
                self._learn(file, stat, value)

    def _recall(self, file: Path, stat: os.stat_result) -> str | None:
        """The sha256 this cache, else the machine's, knows for `file` as `stat` describes it."""
        key = self._key_of(file)
        known = self._known(key, stat)
        if known is None and self._machine() is not None:
            known = self._machine()._recall(file, stat)
            if known is not None:
                self._remember(key, stat, known)
        return known

    def _learn(self, file: Path, stat: os.stat_result, value: str) -> None:
        self._remember(self._key_of(file), stat, value)
        if self._machine() is not None:
            self._machine()._learn(file, stat, value)

    def _machine(self) -> HashCache | None:
        if self._shared is None and self.shared_path is not None:
            self._shared = HashCache(self.shared_path, limit=MACHINE_ENTRIES)
        return self._shared

    def _known(self, key: str, stat: os.stat_result) -> str | None:
        entry = self._entries.get(key)
        return entry[-1] if entry and entry[:-1] == _stamp(stat) else None

    def _remember(self, key: str, stat: os.stat_result, value: str) -> None:
        """`value` for the file as `stat` (taken before it was read) describes it."""
        if time.time_ns() - stat.st_ctime_ns > RECENT_NS:  # a file still being written is hashed again
            self._entries.pop(key, None)  # last in the order: the most recently learnt
            self._entries[key] = [*_stamp(stat), value]
            self._learnt.add(key)
        self._dirty = True

    def save(self) -> None:
        """Best effort: a cache that cannot be written only costs a re-hash next time. Entries another
        process saved meanwhile are kept (the machine's cache has many writers)."""
        if self._shared is not None:
            self._shared.save()
        if not self._dirty:
            return
        self._entries = self._merged()
        text = json.dumps({"version": self.VERSION, "key": self._key.hex(), "entries": self._entries})
        # a workdir's parent is never made (not a workdir removed while in use: its run reports that)
        if write_private(self.path, text, parents=self.limit is not None):
            self._dirty = False
            self._learnt.clear()

    def _merged(self) -> dict[str, list]:
        """The entries to save: those saved meanwhile under this cache's key, then those learnt here
        (the newest last), the oldest dropped beyond the limit."""
        key, saved = self._load()
        if key != self._key:
            saved = {}
        for learnt in self._learnt:
            saved.pop(learnt, None)
        merged = {**{k: v for k, v in self._entries.items() if k not in self._learnt}, **saved,
                  **{k: v for k, v in self._entries.items() if k in self._learnt}}
        if self.limit is not None and len(merged) > self.limit:
            merged = dict(list(merged.items())[-self.limit:])
        return merged
