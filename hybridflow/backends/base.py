"""The one interface every engine implements. It moves data and manages a lifecycle; it never
abstracts DataFrame operations: stage code is written against the engine's own API."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sys
import threading
from abc import ABC, abstractmethod
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..data.storage import ObjectPath
from ..data.tables import TableSource, ensure_schema_file
from ..definition.pipeline import REDACTED
from ..settings import TARGET_FILE_SIZE
from .stagelog import private_dir

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa


class Backend(ABC):
    name: str
    frame_types: str  # what stages on this engine return, in words, for error messages

    @abstractmethod
    def start(self, code: Sequence[Path] = ()) -> None:
        """Start the engine, or attach to the cluster the settings name. Called once, on first use.
        `code`: the stage packages (directories or .py files under the pipeline root) that the
        engine's worker processes must be able to import to run functions defined in them."""

    def reload_code(self, code: Sequence[Path]) -> bool:
        """The stage code changed while the engine runs (hybridflow run --watch): make its workers
        import the new `code` (as in start) from now on. Returns False where the engine cannot (its
        workers keep modules they imported): then it is restarted."""
        return False

    @abstractmethod
    def read(self, source: TableSource) -> Any:
        """A dataset as this engine's native frame."""

    def write(self, frame: Any, directory: PurePath, partition_by: tuple[str, ...] = (),
              target_file_size: int = TARGET_FILE_SIZE) -> pa.Schema:
        """Write a native frame as Parquet into an empty staging directory (Hive-style directories when
        partitioned); returns the frame's full Arrow schema. Zero rows still leave a file with the schema.
        `directory` is local, or (only for engines that set writes_object_storage) a prefix in object
        storage, a storage.ObjectPath that the engine reaches through `store`."""
        schema = self.write_files(frame, directory, partition_by, target_file_size)
        self.write_schema_file(directory, schema, partition_by)
        return schema

    def write_schema_file(self, directory: PurePath, schema: pa.Schema, partition_by: tuple[str, ...]) -> None:
        """After write_files: a schema file where no row was written (see ensure_schema_file)."""
        remote = isinstance(directory, ObjectPath)
        ensure_schema_file(directory, schema, partition_by, self.store.arrow_filesystem() if remote else None)

    @abstractmethod
    def write_files(self, frame: Any, directory: PurePath, partition_by: tuple[str, ...],
                    target_file_size: int) -> pa.Schema:
        """The engine's own Parquet write, in files of about `target_file_size` bytes: one per
        partition when the output is small, never one per task; returns the whole frame's Arrow schema."""

    # Whether the engine writes outputs into object storage itself (its workers may run on hosts that
    # share no disk with the runner): a workdir in object storage then hands it the version's prefix.
    # Engines running in the runner's process write a local staging directory, which is uploaded.
    writes_object_storage: bool = False

    # The engine's own target_file_size setting, or None (then the dataset's, or the default, applies).
    # Set by backends.create.
    target_file_size: int | None = None

    # Values that came from ${env:...}: an engine that records its configuration (Spark's event log)
    # is told to redact them. Set by backends.create.
    secrets: tuple[str, ...] = ()

    # Stages with a timeout call their function in a forked child process that the timeout (or a stop
    # request) can kill at once, even inside native code (see childprocess); only for engines whose
    # stages need no engine connection, since a child cannot share the parent's (a JVM, a Ray driver).
    isolated_calls: bool = False

    def is_frame(self, value: Any) -> bool:
        """Whether a stage's return value is a frame this engine can write."""
        return True

    def run_sql(self, query: Any, inputs: dict[str, Any], params: dict[str, Any]) -> Any:
        """A SQL stage (engines whose Engine declares a sql_dialect): `query` (a sqlstage.SqlQuery) over
        `inputs`, native frames each seen as a view named after its dataset, with `params` (the names
        the query uses as `:name`) bound by the engine, never formatted into the text. Returns the
        result as a native frame."""
        raise NotImplementedError(f"the {self.name} backend runs no SQL stage")

    # Data checks (backends/checkplan.py), over the version a stage just wrote. These defaults run in
    # this process on Arrow (the python engine's way); engines with workers or SQL override them.

    def write_measured(self, frame: Any, directory: PurePath, partition_by: tuple[str, ...],  # noqa: PLR0913 - write's own and a plan
                       target_file_size: int, plan) -> tuple[pa.Schema, dict[str, Any] | None]:
        """`write`, and every measure of `plan` taken from the rows as they were written where the engine
        holds them anyway (no second read of the files): (schema, measures), or (schema, None) where it
        cannot (the checks then read the files back)."""
        return self.write(frame, directory, partition_by, target_file_size), None

    def check_frame(self, source: TableSource) -> Any:
        """The written output as the checks read it (a frame check_split's results can be written from)."""
        from ..data.tables import read_arrow

        return read_arrow(source)

    def check_measure(self, frame: Any, plan) -> dict[str, Any]:
        """Every measure of `plan` in one pass over `frame`."""
        return plan.combine([plan.arrow_partials(frame)])

    def check_measure_groups(self, frame: Any, plan) -> dict[tuple, dict[str, Any]]:
        """Every measure of `plan` per partition ({values of plan.group_by: measures}), in one pass."""
        return plan.combine_by([plan.arrow_partials_by(frame)])

    def check_split(self, frame: Any, plan, checks) -> tuple[Any, Any]:
        """(rows passing every one of `checks`, the others with a `check` column naming the first failed)."""
        return plan.arrow_split(frame, checks)

    def check_head(self, frame: Any, columns: list[str], n: int) -> list[dict[str, Any]]:
        """The first `n` rows of `frame`, only `columns`: the examples an error quotes."""
        return frame.select(columns).slice(0, n).to_pylist()

    def check_count(self, frame: Any) -> int:
        """The rows of a frame a python check returned as its failing rows."""
        return len(frame)

    def handles(self) -> dict[str, Any]:
        """Engine objects exposed on ctx (ctx.spark, ctx.dask, ctx.ray)."""
        return {}

    # The object store (a data.stores.Settings) the pipeline reads or writes (s3:// or gs:// inputs, a workdir
    # in object storage), for engines that must be set up for it when they start (Spark's s3a), or
    # None. Set by backends.create; each TableSource says how to reach its own files.
    store: Any = None

    # GPU resources this engine was started with (a gpu.EngineGpu), or None for a CPU engine. Set by
    # backends.create before start(); the engine is shared, so each stage then says its own device.
    gpu: Any = None
    stage_on_gpu: bool = False
    lineage: Any = None  # where the run's OpenLineage events go (definition.lineageids.LineageTarget), or None

    def begin_stage(self, on_gpu: bool, params: dict[str, Any], log) -> None:
        """Called before each stage on this engine: whether this stage runs on the GPU (only ever true
        when the engine has GPU resources), its params, and its log."""
        self.stage_on_gpu = on_gpu

    def stage_lineage(self, run_id: str, stage: str, log) -> contextlib.AbstractContextManager:
        """Around a stage's try: the engine's own lineage events of the work it runs for the stage,
        nested under the stage's OpenLineage run (Spark's listener; `lineage`, set when the pipeline
        has `lineage:`). Nothing for engines without lineage of their own."""
        return contextlib.nullcontext()

    def engine_work(self) -> int | None:
        """How many units of work the engine has run so far (Spark jobs, Dask task graphs, Ray Data
        executions), or None where it does not count them. Read before and after each stage's read,
        call and publish, so that a run record shows what each phase cost the engine; cheap, and never
        waits on work."""
        return None

    def progress(self) -> str | None:
        """What the engine is doing for the running stage, as a short phrase ("job 2 · tasks 120/200"),
        or None when it has nothing to say. Polled about once a second from another thread while a stage
        runs (see hybridflow.execution.stageprogress): it must be cheap, and must not wait on the stage's work."""
        return None

    def release_gpu_memory(self) -> None:
        """Free GPU memory the previous stage left behind, so it cannot starve the next one."""

    def cancel(self) -> None:
        """Cancel the engine work of the running stage (its timeout fired). Called from another
        thread; best effort: the runner stops the engine afterwards anyway."""

    def abandon(self) -> None:
        """The run is being ended around a stage stuck in this process, and every process the engine
        started is about to be killed: stop whatever in this process would start replacements. Called
        from another thread; must not block."""

    def stop(self) -> None:
        """Stop what this backend started (never an attached cluster). Safe to call twice."""

    def check_versions(self) -> None:
        """Attached to a cluster: fail with UnavailableError, before any data moves, unless its workers run
        this machine's Python (major.minor), pyarrow and engine versions (see require_same_versions)."""

    def check_shared_workdir(self, workdir: Path) -> bool:
        """Attached to a cluster on other hosts: fail with UnavailableError, before any data moves,
        unless its workers see `workdir` under the same path (they read and write the hand-off Parquet
        there themselves). Returns whether there was a cluster to check; an engine running on this
        host (embedded, or a cluster on loopback) has nothing to check."""
        return False


def measured_or_none(measure) -> dict[str, Any] | None:
    """The measures `measure()` takes while an output is written, or None where it fails: the checks
    then measure the written files, and say what failed as a check's failure, not the write's."""
    try:
        return measure()
    except Exception:  # noqa: BLE001 - told by the checks, measuring again
        return None


@contextlib.contextmanager
def process_output_to(path: Path):
    """Point this process's stdout and stderr file descriptors at `path` while an engine starts, so
    the processes it launches (a JVM, Ray's daemons, Dask's workers) write their chatter there for
    good instead of over the progress display. Python-level streams are left alone. Nothing is
    redacted: a run uses EngineOutput, which is."""
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        with _standard_fds_to(target):
            yield
    finally:
        os.close(target)


@contextlib.contextmanager
def _standard_fds_to(target: int):
    sys.stdout.flush()
    sys.stderr.flush()
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
        for fd in saved:
            os.close(fd)


class EngineOutput:
    """A run's engines.log, fed through a pipe. The processes an engine launches while `redirected()`
    inherit the pipe as their stdout and stderr for good (a Spark JVM, Dask workers: a UDF's or a
    task's exception text lands there), and a thread of this process removes every secret before the
    bytes reach the file, so a value from ${env:...} is never on disk in clear. The file is the
    owner's only (0600) and is created on the first redirect. The thread drains the pipe as fast as
    engines write (a writer never blocks for long), and close() ends it once every writer is gone."""

    PIPE_BYTES = 2**20  # a larger pipe: a burst of output never waits for the thread

    def __init__(self, path: Path, secrets: Iterable[str] = ()) -> None:
        self.path = path
        self.secrets = tuple(secrets)
        self._write_end: int | None = None
        self._pump: threading.Thread | None = None

    @contextlib.contextmanager
    def redirected(self):
        """This process's fds 1 and 2 point at the pipe while the block runs (an engine starts)."""
        if self._write_end is None:
            self._open()
        _start_lasting_helpers()
        with _standard_fds_to(self._write_end):
            yield

    def close(self, timeout: float = 10.0) -> bool:
        """Called once the engines are stopped: waits up to `timeout` seconds for the processes that
        still hold the pipe to exit, having written all they wrote. Returns whether the thread ended;
        when a process outlives that (a straggler still shutting down), the thread keeps copying
        until it exits rather than block or break it, and ends by itself. Safe to call twice."""
        if self._write_end is not None:
            os.close(self._write_end)
            self._write_end = None
        pump, self._pump = self._pump, None
        if pump is None:
            return True
        pump.join(timeout)
        return not pump.is_alive()

    def _open(self) -> None:
        log = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(log, 0o600)  # a file left by an earlier version, or made under a lax umask
        read_end, write_end = os.pipe()
        with contextlib.suppress(OSError, AttributeError):  # Linux only; the default pipe still works
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, self.PIPE_BYTES)
        self._write_end = write_end
        self._pump = threading.Thread(target=_copy_redacted, args=(read_end, log, StreamRedactor(self.secrets)),
                                      name=f"hybridflow-engine-output-{self.path.parent.parent.name}", daemon=True)
        self._pump.start()


class TerminalStreams:
    """sys.stdout and sys.stderr on copies of fds 1 and 2, until restore(): while engines start in
    the background, fds 1 and 2 point at engines.log (for the processes they launch), and this
    process's own output must still reach the terminal. Output already buffered is flushed first."""

    def __init__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _copy_of(sys.stdout, 1)
        sys.stderr = _copy_of(sys.stderr, 2)

    def restore(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = self._saved


def engine_output_stream():
    """A text stream on a copy of this process's stderr as it is now: called during an engine's
    start, while the runner points fd 2 at engines.log, it is where the engine's own chatter from
    this process (its loggers) goes for good. Line buffered; the caller closes it at stop."""
    return os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")


def _copy_of(stream, fd: int):
    """A text stream like `stream` writing to a duplicate of `fd` (line buffered, as a terminal is)."""
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",
                     errors=getattr(stream, "errors", None) or "strict")


def _start_lasting_helpers() -> None:
    """Start now, with this process's own stdout and stderr, the helpers that outlive every engine:
    started during a redirect they would hold the pipe until the interpreter exits and close() could
    never see its end. multiprocessing's resource tracker is one (Dask's worker processes start it)."""
    from multiprocessing import resource_tracker

    with contextlib.suppress(Exception):
        resource_tracker.ensure_running()


def _copy_redacted(read_end: int, log: int, redactor: StreamRedactor) -> None:
    """The pipe to the file until every writer has closed it. Never raises: whatever goes wrong, it
    keeps reading, so a writer can never block on a full pipe (this thread's own stderr may be the
    pipe, so it cannot report either)."""
    try:
        while data := os.read(read_end, 2**16):
            _write_all(log, redactor.feed(data))
        _write_all(log, redactor.flush())
    except BaseException:  # nothing can be reported: read on, discarding
        with contextlib.suppress(BaseException):
            while os.read(read_end, 2**16):
                pass
    finally:
        for fd in (read_end, log):
            with contextlib.suppress(OSError):
                os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # a full disk loses log text, never blocks the engines
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


class StreamRedactor:
    """Replaces secrets in a byte stream that arrives in arbitrary pieces: what it returns, joined, is
    the whole stream with every secret replaced (at each position the longest secret that matches
    wins). A tail that could be the start of a secret is held back until the next piece decides."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = sorted({s.encode() for s in secrets if s}, key=len, reverse=True)
        self._pattern = re.compile(b"|".join(re.escape(s) for s in self.secrets)) if self.secrets else None
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        """What of the stream so far can be written now, redacted."""
        text = self._held + data
        if self._pattern is None:
            return text
        partial = self._partial_starts(text)  # where a secret may begin that the next piece completes
        out, pos = [], 0
        for match in self._pattern.finditer(text):
            stop = next((p for p in partial if pos <= p <= match.start()), None)
            if stop is not None:  # a longer secret may start there: decide when more has come
                break
            out += [text[pos:match.start()], REDACTED.encode()]
            pos = match.end()
        stop = next((p for p in partial if p >= pos), len(text))
        self._held = text[stop:]
        return b"".join([*out, text[pos:stop]])

    def flush(self) -> bytes:
        """The held-back tail, at the end of the stream."""
        held, self._held = self._held, b""
        return self._pattern.sub(REDACTED.encode(), held) if self._pattern else held

    def _partial_starts(self, text: bytes) -> list[int]:
        """Positions, in order, from which the rest of `text` is a proper prefix of some secret."""
        first = max(len(text) - len(self.secrets[0]) + 1, 0)
        return [i for i in range(first, len(text))
                if any(len(s) > len(text) - i and s.startswith(text[i:]) for s in self.secrets)]


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


def check_reachable(backend: str, address: str, host: str, port: int, timeout: float = 5.0,
                    source: str | None = None) -> None:
    """Fail fast with one line when a cluster address does not answer (engines would retry for minutes).
    `source`: the local address the driver binds to and advertises, which the connection leaves from."""
    import errno
    import socket

    from ..errors import UnavailableError

    try:
        with socket.create_connection((host, port), timeout=timeout,
                                      source_address=(source, 0) if source else None):
            pass
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL and source:
            raise UnavailableError(f"the {backend} driver cannot bind to {source}: it is not an address of this host",
                                   hint=f"fix or remove backends.{backend}.advertise_address") from None
        raise UnavailableError(f"cannot reach the {backend} cluster at {address}: {exc.strerror or exc}",
                               hint=f"start it, or fix backends.{backend} in the pipeline file") from None


def is_loopback_host(host: str) -> bool:
    """Whether every address `host` names is a loopback one (127.0.0.0/8, ::1): a cluster on this host."""
    import ipaddress
    import socket

    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (socket.gaierror, UnicodeError):
        return False  # check_reachable says what is wrong with it
    return bool(found) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found)


def local_address_towards(host: str, port: int) -> str:
    """The one address of this host that the kernel routes `host` from: a connected UDP socket sends
    nothing, but its local end is chosen by the routing table."""
    import socket

    family, _, _, _, target = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(target)
        return probe.getsockname()[0]


def driver_address(host: str, port: int, advertise: str | None) -> str | None:
    """Where the driver side of an engine attached to a cluster at host:port binds and what it tells
    the cluster to call back: `advertise` (backends.<engine>.advertise_address) or the local address
    that routes to the cluster; None for a cluster on loopback, which stays on 127.0.0.1 like an
    embedded engine. Never a wildcard address."""
    if is_loopback_host(host):
        return None
    try:
        return advertise or local_address_towards(host, port)
    except OSError:
        return None  # no route: check_reachable reports it


def versions_probe():
    """A function giving its process's Python (major.minor) and the versions of the packages it is
    asked for: what a worker's must equal the driver's. Made here, nested, so that cloudpickle ships it
    by value (a module-level function goes by reference, and a worker without hybridflow could not
    load it); it imports what it uses itself."""
    def versions(*packages: str) -> dict[str, str]:
        import importlib
        import sys

        found = {"python": f"{sys.version_info[0]}.{sys.version_info[1]}"}
        for package in packages:
            try:
                found[package] = getattr(importlib.import_module(package), "__version__", "unknown")
            except ImportError:
                found[package] = "not installed"
        return found

    return versions


def require_same_versions(backend: str, address: str, workers: dict[str, dict[str, str]],
                          packages: tuple[str, ...]) -> None:
    """One line and exit 69 when a worker runs other versions than this machine: a pickled function or
    Parquet written by another pyarrow then fails deep in a stage, or silently differs."""
    from ..errors import UnavailableError

    here = versions_probe()(*packages)
    for worker, theirs in sorted(workers.items()):
        different = [f"{name} {theirs.get(name, 'unknown')} (here {version})" for name, version in here.items()
                     if theirs.get(name) != version]
        if different:
            others = sum(1 for w in workers.values() if any(w.get(k) != v for k, v in here.items())) - 1
            raise UnavailableError(f"the {backend} cluster at {address}: worker {worker} runs "
                                   f"{', '.join(different)}{f' (and {others} more workers differ)' if others else ''}",
                                   hint="install the driver's versions on every node (python -m pip freeze "
                                        "here says which)")


def require_shared_workdir(backend: str, address: str, workdir: Path, seen_by_workers) -> None:
    """Write a marker file into `workdir` here and ask the cluster's workers whether they see it:
    `seen_by_workers(path)` runs on them and returns one answer (True: the file is there) per worker
    it reached. Raises a one-line UnavailableError (exit 69) unless every answer is yes."""
    import uuid

    from ..errors import UnavailableError, first_line

    workdir.mkdir(parents=True, exist_ok=True)
    marker = workdir / f".hybridflow-shared-{uuid.uuid4().hex}"
    marker.write_bytes(b"")
    try:
        answers = list(seen_by_workers(str(marker)))
    except Exception as exc:
        raise UnavailableError(f"cannot check that the {backend} cluster at {address} sees the workdir {workdir}: "
                               f"{first_line(exc)}", hint="check that the cluster has workers") from exc
    finally:
        marker.unlink(missing_ok=True)
    if not answers or not all(answers):
        missing = "no worker answered" if not answers else \
            f"{answers.count(False)} of {len(answers)} workers do not see a file written there"
        raise UnavailableError(f"the workdir {workdir} is not shared with the {backend} cluster at {address}: "
                               f"{missing}",
                               hint="mount it on every node under the same path (NFS or another shared "
                                    "filesystem), or set workdir: to a path that is")


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

    into = private_dir(into / "shipped-code")  # under the run's logs: the owner's only
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]
    archive = into / f"{path.stem}-{digest}.zip"
    if not archive.exists():
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
            for file in files:
                bundle.write(file, file.relative_to(path.parent).as_posix())
        os.chmod(archive, 0o600)
    return archive
