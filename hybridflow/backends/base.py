"""The one interface every engine implements. It moves data and manages a lifecycle; it never
abstracts DataFrame operations: stage code is written against the engine's own API."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, Sequence

from ..data.storage import ObjectPath
from ..data.tables import TableSource, ensure_schema_file
from ..settings import TARGET_FILE_SIZE

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

    # Whether the engine reaches the pipeline's object store through this machine (it has no way of its
    # own there: Spark and az://): its inputs are copies hybridflow downloads, its outputs local staging
    # hybridflow uploads. Set by place.
    local_copies: bool = False

    # The engine's own target_file_size setting, or None (then the dataset's, or the default, applies).
    # Set by place.
    target_file_size: int | None = None

    # Values that came from ${env:...}: an engine that records its configuration (Spark's event log)
    # is told to redact them. Set by place.
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
    # None. Set by place; each TableSource says how to reach its own files.
    store: Any = None

    # GPU resources this engine was started with (a gpu.EngineGpu), or None for a CPU engine. Set by
    # place before start(); the engine is shared, so each stage then says its own device.
    gpu: Any = None
    stage_on_gpu: bool = False
    lineage: Any = None  # where the engine's own OpenLineage events go (LineageTarget; place), or None

    def place(self, gpu: Any, secrets: tuple[str, ...], store: Any, copies: bool,
              target_file_size: int | None, lineage: Any = None) -> None:
        """Before start(), once (backends.create): the GPU resources, secrets, object store and lineage
        target the engine is started with; `copies`: it reaches that store through local copies, so it
        is given none and writes local staging."""
        self.gpu, self.secrets, self.target_file_size, self.lineage = gpu, secrets, target_file_size, lineage
        self.store = None if copies else store
        self.local_copies = copies
        if copies:
            self.writes_object_storage = False

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
