"""The hash cache of external inputs: files hashed side by side before a run decides its stages."""

from __future__ import annotations

import hashlib
import os
import time

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


def hashed_files(monkeypatch) -> list:
    """The files hashed from now on (their bytes read), while still hashing them."""
    from hybridflow.data import hashing

    read, real = [], hashing.file_sha256
    monkeypatch.setattr("hybridflow.data.hashing.file_sha256", lambda path: read.append(path) or real(path))
    return read


def test_a_fresh_workdir_is_told_by_the_machine_cache_what_another_workdir_hashed(tmp_path, monkeypatch):
    files = [written(tmp_path / f"raw-{i}.bin", bytes([i]) * 2**20) for i in range(2)]
    machine = tmp_path / "machine" / "hashes.json"  # its folder is made when first saved
    first = HashCache(tmp_path / "one" / "hashes.json", shared=machine)
    first.warm(files)
    (tmp_path / "one").mkdir()
    first.save()

    read = hashed_files(monkeypatch)
    fresh = HashCache(tmp_path / "two" / "hashes.json", shared=machine)
    assert [fresh.sha256(f) for f in files] == [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    assert read == []
    assert machine.stat().st_mode & 0o077 == 0


def rewritten_keeping_size_and_mtime(path, content: bytes, *, new_inode: bool) -> None:
    before = path.stat()
    assert len(content) == before.st_size
    time.sleep(0.02)  # past the file system clock's tick (ctime is stamped from it)
    if new_inode:  # an editor's or rsync's way: a new file renamed over the old one
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(content)
        tmp.replace(path)
    else:
        path.write_bytes(content)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # cp -p, touch -r, rsync -t do this
    assert path.stat().st_mtime_ns == before.st_mtime_ns and path.stat().st_size == before.st_size


@pytest.mark.parametrize("new_inode", [False, True], ids=["in-place", "renamed-over"])
def test_a_file_rewritten_with_its_size_and_mtime_kept_is_hashed_again_in_another_workdir(tmp_path, new_inode):
    raw = written(tmp_path / "raw.bin", b"a" * 4096)
    machine = tmp_path / "machine.json"
    first = HashCache(tmp_path / "one.json", shared=machine)
    assert first.sha256(raw) == hashlib.sha256(b"a" * 4096).hexdigest()
    first.save()

    rewritten_keeping_size_and_mtime(raw, b"b" * 4096, new_inode=new_inode)
    for cache in (HashCache(tmp_path / "two.json", shared=machine), HashCache(tmp_path / "one.json", shared=machine)):
        assert cache.sha256(raw) == hashlib.sha256(b"b" * 4096).hexdigest()


def test_two_processes_saving_the_machine_cache_keep_each_others_entries(tmp_path, monkeypatch):
    files = [written(tmp_path / f"raw-{i}.bin", bytes([i]) * 100) for i in range(3)]
    machine = tmp_path / "machine.json"
    made = HashCache(machine)
    made.sha256(files[2])
    made.save()  # the machine's cache exists: both open it
    one, two = HashCache(machine), HashCache(machine)
    one.sha256(files[0])
    two.sha256(files[1])
    one.save()
    two.save()

    read = hashed_files(monkeypatch)
    later = HashCache(machine)
    [later.sha256(f) for f in files]
    assert read == []


def test_the_machine_cache_keeps_the_most_recently_learnt_files_up_to_its_limit(tmp_path, monkeypatch):
    files = [written(tmp_path / f"raw-{i}.bin", bytes([i]) * 100) for i in range(3)]
    cache = HashCache(tmp_path / "machine.json", limit=2)
    for file in files:
        cache.sha256(file)
    cache.save()

    read = hashed_files(monkeypatch)
    later = HashCache(tmp_path / "machine.json", limit=2)
    [later.sha256(f) for f in files]
    assert read == [files[0]]  # the oldest was dropped, the two newest kept
