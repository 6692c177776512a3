"""The one interface every engine implements. It moves data and manages a lifecycle; it never
abstracts DataFrame operations: stage code is written against the engine's own API."""

from __future__ import annotations

import contextlib
import os
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa

from ..tables import TableSource, ensure_schema_file


class Backend(ABC):
    name: str
    frame_types: str  # what stages on this engine return, in words, for error messages

    @abstractmethod
    def start(self, code: Sequence[Path] = ()) -> None:
        """Start the engine, or attach to the cluster the settings name. Called once, on first use.
        `code`: the stage packages (directories or .py files under the pipeline root) that the
        engine's worker processes must be able to import to run functions defined in them."""

    @abstractmethod
    def read(self, source: TableSource) -> Any:
        """A dataset as this engine's native frame."""

    def write(self, frame: Any, directory: Path, partition_by: tuple[str, ...] = ()) -> pa.Schema:
        """Write a native frame as Parquet into an empty staging directory (Hive-style directories when
        partitioned); returns the frame's full Arrow schema. Zero rows still leave a file with the schema."""
        schema = self.write_files(frame, directory, partition_by)
        ensure_schema_file(directory, schema, partition_by)
        return schema

    @abstractmethod
    def write_files(self, frame: Any, directory: Path, partition_by: tuple[str, ...]) -> pa.Schema:
        """The engine's own Parquet write; returns the Arrow schema of the whole frame."""

    def is_frame(self, value: Any) -> bool:
        """Whether a stage's return value is a frame this engine can write."""
        return True

    def handles(self) -> dict[str, Any]:
        """Engine objects exposed on ctx (ctx.spark, ctx.dask, ctx.ray)."""
        return {}

    # GPU resources this engine was started with (a gpu.EngineGpu), or None for a CPU engine. Set by
    # backends.create before start(); the engine is shared, so each stage then says its own device.
    gpu: Any = None
    stage_on_gpu: bool = False

    def begin_stage(self, on_gpu: bool, params: dict[str, Any], log) -> None:
        """Called before each stage on this engine: whether this stage runs on the GPU (only ever true
        when the engine has GPU resources), its params, and its log."""
        self.stage_on_gpu = on_gpu

    def release_gpu_memory(self) -> None:
        """Free GPU memory the previous stage left behind, so it cannot starve the next one."""

    def cancel(self) -> None:
        """Cancel the engine work of the running stage (its timeout fired). Called from another
        thread; best effort: the runner stops the engine afterwards anyway."""

    def stop(self) -> None:
        """Stop what this backend started (never an attached cluster). Safe to call twice."""


@contextlib.contextmanager
def process_output_to(path: Path):
    """Point this process's stdout and stderr file descriptors at `path` while an engine starts, so
    the processes it launches (a JVM, Ray's daemons, Dask's workers) write their chatter there for
    good instead of over the progress display. Python-level streams are left alone."""
    sys.stdout.flush()
    sys.stderr.flush()
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


ENGINE_PACKAGES = ("ray", "pyspark", "py4j", "distributed", "dask", "org.apache", "java.")
ENGINE_WRAPPERS = ("PythonException", "Py4JJavaError", "UserCodeException", "RayTaskError", "TaskError")


def is_engine_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(ENGINE_PACKAGES)


def index_as_columns(frame):
    """A named index is data (set_index("customer_id")) and becomes columns; an unnamed one is a row
    position left over from filtering or sorting, and is dropped. Same rule for pandas and Dask."""
    names = getattr(frame.index, "names", None) or [frame.index.name]  # a Dask Index has only .name
    if any(name is not None for name in names):
        return frame.reset_index()
    return frame


def unwrap_error(exc: BaseException) -> BaseException:
    """The user's own exception inside an engine's wrappers (Ray's RayTaskError carries it as .cause,
    Ray Data's UserCodeException as __cause__)."""
    for _ in range(10):
        if not is_engine_error(exc):
            break
        inner = getattr(exc, "cause", None) or exc.__cause__
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


def check_reachable(backend: str, address: str, host: str, port: int, timeout: float = 5.0) -> None:
    """Fail fast with one line when a cluster address does not answer (engines would retry for minutes)."""
    import socket

    from ..errors import UnavailableError

    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise UnavailableError(f"cannot reach the {backend} cluster at {address}: {exc.strerror or exc}",
                               hint=f"start it, or fix backends.{backend} in the pipeline file") from None


def split_host_port(address: str, default_port: int) -> tuple[str, int]:
    """'spark://h:7077', 'tcp://h:8786', 'h:6379' -> (host, port)."""
    rest = address.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = rest.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else (rest, default_port)


def case_collisions(names: list[str]) -> list[str]:
    """Column names that differ only by case: Spark refuses them, other engines do not."""
    seen: dict[str, str] = {}
    clashes = []
    for name in names:
        other = seen.setdefault(name.lower(), name)
        if other != name:
            clashes.append(f"'{other}' and '{name}'")
    return clashes


def code_archive(path: Path, into: Path) -> Path:
    """A zip of one stage package (or module file) that engines ship to their workers."""
    import hashlib
    import zipfile

    into = into / "shipped-code"
    into.mkdir(parents=True, exist_ok=True)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]
    archive = into / f"{path.stem}-{digest}.zip"
    if not archive.exists():
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
            for file in files:
                bundle.write(file, file.relative_to(path.parent).as_posix())
    return archive
