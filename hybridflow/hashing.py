"""Content hashes of files, remembered by (size, mtime, inode) so unchanged raw data is not re-read.

Published versions carry their files' sha256 in their manifests; this cache serves external inputs,
which hybridflow does not own: a file is hashed again only when its size, mtime or inode changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def digest_of(items) -> str:
    """One sha256 over (name, hash) pairs, independent of the order they come in."""
    digest = hashlib.sha256()
    for name, value in sorted(items):
        digest.update(f"{name}\0{value}\n".encode())
    return digest.hexdigest()


class HashCache:
    """sha256 of files by path, trusted while the file's size, mtime and inode are unchanged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._entries: dict[str, list] = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            self._entries = {}
        self._dirty = False

    def sha256(self, file: Path) -> str:
        stat = file.stat()
        key, stamp = str(file.resolve()), [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        entry = self._entries.get(key)
        if entry and entry[:3] == stamp:
            return entry[3]
        value = file_sha256(file)
        self._entries[key] = [*stamp, value]
        self._dirty = True
        return value

    def save(self) -> None:
        """Best effort: a cache that cannot be written only costs a re-hash next time."""
        if not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self._entries))
            os.replace(tmp, self.path)
            self._dirty = False
        except OSError:
            pass
