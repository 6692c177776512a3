"""Engine sessions for tests: small, bound to 127.0.0.1, one per engine per test module."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hybridflow import backends
from hybridflow.backends.engineoutput import process_output_to
from hybridflow.engines.dask import DaskSettings
from hybridflow.engines.duckdb import DuckDBSettings
from hybridflow.engines.polars import PolarsSettings
from hybridflow.engines.ray import RaySettings
from hybridflow.engines.spark import SparkSettings

ENGINES = ("python", "spark", "dask", "ray", "duckdb", "polars")
TEST_SETTINGS = {
    "python": None,
    "spark": SparkSettings(master="local[2]", conf={"spark.sql.shuffle.partitions": 2}),
    "dask": DaskSettings(n_workers=1, threads_per_worker=2),
    "ray": RaySettings(num_cpus=2),
    "duckdb": DuckDBSettings(threads=2, memory_limit="2GB"),
    "polars": PolarsSettings(memory_limit="2GB"),
}


def start_engines(log_dir: Path, names=ENGINES, code=(), store=None) -> dict:
    """`store`: the object store (stores.s3.S3Settings) the engines must be able to read (Spark's s3a)."""
    started = {}
    try:
        for name in names:
            engine = backends.create(name, TEST_SETTINGS[name], log_dir, store=store)
            with process_output_to(log_dir / "engines.log"):
                engine.start(code)
            started[name] = engine
    except BaseException:
        for engine in started.values():  # never leave a half-started set of engines behind
            engine.stop()
        raise
    return started


def engines_for_module(tmp_path_factory, project, store=None):
    """Every engine, shipping `project`'s stage package to their workers, for one test module: a
    module-scoped fixture does `yield from engines_for_module(...)`, and they stop when it ends."""
    started = start_engines(tmp_path_factory.mktemp("engine-logs"), code=[project.root / "mypkg"], store=store)
    try:
        yield started
    finally:
        for engine in started.values():
            engine.stop()


def child_pids(pid: int | None = None) -> set[int]:
    """Every live descendant of `pid` (default: this process), read from /proc. Python's own
    multiprocessing resource tracker is left out: it belongs to this interpreter, not to an engine,
    and ends with it."""
    pid = os.getpid() if pid is None else pid
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and b"resource_tracker" not in _cmdline(entry):
                parents[int(entry.name)] = int(fields[1])
    return descendants([pid], parents)


def descendants(roots: list[int], parents: dict[int, int]) -> set[int]:
    """Every process below `roots` in a {pid: parent pid} map (the roots themselves not included)."""
    found: set[int] = set()
    todo = list(roots)
    while todo:
        current = todo.pop()
        for child, parent in parents.items():
            if parent == current and child not in found:
                found.add(child)
                todo.append(child)
    return found


def _cmdline(entry: Path) -> bytes:
    try:
        return (entry / "cmdline").read_bytes()
    except OSError:
        return b""


def assert_nothing_left(marker: str, seconds: float) -> None:
    """No process carrying `marker` in its environment is alive within `seconds`."""
    deadline = time.monotonic() + seconds
    while (left := processes_with_env(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes outlived the run: {left}"


def processes_with_env(marker: str) -> list[str]:
    """Command lines of live processes whose environment holds `marker` (an engine's children too)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found
