"""The hash cache of external inputs: files hashed side by side before a run decides its stages."""

from __future__ import annotations

import hashlib

import pytest

from hybridflow.data.hashing import HashCache


@pytest.fixture(autouse=True)
def remembered_at_once(monkeypatch):
    """Files just written are remembered (the cache waits a moment before it trusts a new file's stat)."""
    monkeypatch.setattr("hybridflow.data.hashing.RECENT_NS", -1)


def written(path, content: bytes):
    path.write_bytes(content)
    return path


def test_warm_hashes_the_files_side_by_side_and_remembers_them(tmp_path, monkeypatch):
    files = [written(tmp_path / f"part-{i}.bin", bytes([i]) * (i + 1) * 2**20) for i in range(3)]
    cache = HashCache(tmp_path / "hashes.json")
    cache.warm([*files, tmp_path / "missing.bin"])  # a file that cannot be read is left to sha256()

    read_again = []
    monkeypatch.setattr("hybridflow.data.hashing.file_sha256", lambda path: read_again.append(path))
    assert [cache.sha256(f) for f in files] == [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    assert read_again == []


def test_a_file_changed_after_warming_is_hashed_again(tmp_path):
    files = [written(tmp_path / f"part-{i}.bin", b"old" * 1000) for i in range(2)]
    cache = HashCache(tmp_path / "hashes.json")
    cache.warm(files)
    files[0].write_bytes(b"new" * 1000)
    assert cache.sha256(files[0]) == hashlib.sha256(b"new" * 1000).hexdigest()
