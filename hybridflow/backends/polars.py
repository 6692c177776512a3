"""Polars: stages get polars LazyFrames (one per input) and return a LazyFrame or a DataFrame, written
with Polars' own streaming Parquet sink.

Queries run on Polars' streaming engine with an out-of-core memory budget of half this machine's
memory (or of its container's limit), above which the engine spills to a private directory under
the run's logs, removed when the engine stops (`backends.polars` sets both). Inputs are scanned
lazily with their recorded schema: Parquet by Polars itself, partition columns joined from the Hive
paths as every engine parses them; external CSV and JSON through pyarrow's readers, as on every
engine, so the same text gives the same values.

A stage's query runs when hybridflow writes its output, in a process of its own (spawned once per
engine start, and again after a kill) while this thread waits in short sleeps: a timeout, a stop
request or cancel() kills that process, and so the query, at once. Polars 2.1's streaming engine
does not stop a query it was asked to cancel, so a query run in hybridflow's process could only be
left running. A frame already in memory (a DataFrame the stage returned) is written here.
Polars types without a lossless Parquet twin are written as the standard type (Categorical as
string, millisecond timestamps as microseconds) or refused with the column named; a column that
Polars read in another form (a time64[us] as nanoseconds, a fixed-size binary as binary, a +01:00
zone as Etc/GMT-1) is written back as it was read.

GPU stages (`gpu:`, cudf-polars) collect their query with `pl.GPUEngine` on the first visible device
(Polars falls back to its CPU engine for what cudf-polars cannot run) and write the result with the
CPU sink. That path has never run on a GPU: it is built and checked only without one.
"""

from __future__ import annotations

import base64
import contextlib
import json
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import traceback
import warnings
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..data.contract import standard_schema
from ..data.footers import read_footers
from ..data.storage import uri_of
from ..data.tables import (
    FILE_COLUMN,
    SAMPLE_ROWS,
    TableSource,
    parquet_files,
    partition_table,
    respell_partition_directories,
    rows_per_file,
    text_dataset,
    with_string_partitions,
)
from ..engines.polars import ENGINE, PolarsSettings, storage_options
from ..errors import DataError, HybridflowError, StageError, first_line
from . import gpu
from .base import Backend, measured_or_none
from .stagelog import private_dir

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa



BUDGET = "POLARS_OOC_MEMORY_BUDGET_MB"  # Polars' out-of-core budget and spill directory, read from the
SPILL = "POLARS_OOC_SPILL_DIR"  # environment (pl.Config.load reloads them into a running Polars)
POLL = 0.05  # seconds: the longest sleep between looks at a running query
# What a row takes in Polars' memory per byte of snappy Parquet, typically 2 to 4: an output whose
# files are cut by their in-memory size (Polars' own measure) comes out near the target; a file
# more than OVERSIZED times the target (data Parquet barely compresses) is split again.
MEMORY_PER_PARQUET_BYTE = 3
OVERSIZED = 2


class PolarsBackend(Backend):
    name = ENGINE.name
    frame_types = ENGINE.frame_types

    def __init__(self, settings: PolarsSettings | None, log_dir: Path) -> None:
        self.settings = settings or PolarsSettings()
        self.log_dir = log_dir
        self.pl = None  # the polars module, once started
        self._spill: Path | None = None  # the spill directory this backend made (removed at stop)
        self._environment: dict[str, str | None] | None = None  # what start() replaced, put back at stop
        self._queries: _QueryProcess | None = None  # where lazy queries run (started with the engine)
        self._code_paths: list[str] = []  # where the query process imports the stage packages from
        self._cancelled = False
        # this stage's inputs: column -> (its Arrow type, the Polars type it was read as)
        self._read_types: dict[str, tuple[pa.DataType, Any] | None] = {}

    def start(self, code: Sequence[Path] = ()) -> None:
        import polars

        spill = self.settings.spill_directory
        if spill is None:
            spill = self._spill = private_dir(self.log_dir / "polars-spill")
        budget = self.settings.memory_limit or default_memory_limit()
        self._environment = {name: os.environ.get(name) for name in (BUDGET, SPILL)}
        _configure(polars, {BUDGET: str(max(1, budget // 2**20)), SPILL: str(spill)})
        self.pl = polars
        self._code_paths = _import_paths(code)
        self._queries = _QueryProcess()  # inherits the budget and spill settings from the environment

    def reload_code(self, code) -> bool:
        # stages run in this process, which imports the changed modules again; the query process may hold
        # the old ones (a query's Python functions are imported there): a new one starts with them
        self._end_queries()
        self._code_paths = _import_paths(code)
        self._queries = _QueryProcess()
        return True

    def handles(self) -> dict[str, Any]:
        # ctx.polars_engine: what a stage's own collect() should run on, the stage's device
        return {"polars": self.pl, "polars_engine": self._engine()}

    def begin_stage(self, on_gpu: bool, params, log) -> None:
        super().begin_stage(on_gpu, params, log)
        self._read_types = {}

    def release_gpu_memory(self) -> None:
        gpu.release_process_memory()

    def cancel(self) -> None:
        self._cancelled = True  # the waiting write ends and kills the query's process

    def abandon(self) -> None:
        self._end_queries()

    def stop(self) -> None:
        self._end_queries()
        if self._environment is not None:
            _configure(self.pl, self._environment)
            self._environment = None
        if self._spill is not None:
            shutil.rmtree(self._spill, ignore_errors=True)
            self._spill = None
        if self.gpu is not None:
            self.release_gpu_memory()

    def _end_queries(self) -> None:
        queries, self._queries = self._queries, None
        if queries is not None:
            queries.kill()

    def _engine(self):
        """The engine this stage's queries run on: Polars' streaming engine, or cudf-polars on the GPU
        (the first visible device; a query it cannot run falls back to Polars' CPU engine)."""
        if self.stage_on_gpu and self.pl is not None:
            return self.pl.GPUEngine(device=0, raise_on_fail=False)
        return "streaming"

    # running queries

    def _run(self, query, in_memory: bool) -> None:
        """Run a sink on Polars' streaming engine: here for a frame in memory already (its work is
        bounded), otherwise in the query process, waiting in short sleeps that a timeout's or a stop
        request's signal interrupts at once, as does cancel(); a query left running is killed."""
        if in_memory:
            try:
                query.collect(engine="streaming")
            except BaseException as exc:
                known = _in_own_words(exc)
                if known is None:
                    raise
                raise known from exc
            return
        self._cancelled = False
        if self._queries is None:  # killed by an earlier stage's stop
            self._queries = _QueryProcess()
        path = [*self._code_paths, *(entry for entry in sys.path if entry not in self._code_paths)]
        running = self._queries.submit(query.serialize(), path)
        pause = 0.001
        try:
            while not self._cancelled:
                done, _ = wait([running], timeout=pause, return_when=FIRST_COMPLETED)
                if done:
                    break
                pause = min(pause * 2, POLL)
            else:
                raise StageError("the polars query was cancelled")  # its files are partial
        except BaseException:
            self._end_queries()
            raise
        outcome = running.exception()
        if isinstance(outcome, BrokenProcessPool):  # the process died (the OOM killer): a new one next time
            self._end_queries()
            raise StageError("the polars query's process ended without a result",
                             hint="it was killed, or ran out of memory; engines.log may say more")
        if outcome is not None:
            raise _arrived(outcome)

    # reading

    def read(self, source: TableSource):
        import pyarrow as pa

        pl = self.pl
        if source.schema is not None:
            ENGINE.refuse_unrepresentable(source.name, source.schema)
        if source.format != "parquet":
            return self._remember(pl.scan_pyarrow_dataset(text_dataset(source)), source.schema)
        files = parquet_files(source)
        schema = source.schema or with_string_partitions(read_footers(source.name, files, source.filesystem).schema,
                                                          source.partition_by)
        if not files:  # a partitioned input with no partition chosen
            return self._remember(pl.LazyFrame(schema=_polars_schema(pl, schema)), schema)
        stored = pa.schema([field for field in schema if field.name not in source.partition_by])
        with _quiet(pl):
            frame = pl.scan_parquet(
                [uri_of(f) for f in files], schema=_polars_schema(pl, stored), hive_partitioning=False,
                storage_options=storage_options(source.store) if source.store is not None else None,
                include_file_paths=FILE_COLUMN if source.partition_by else None,
                # the forms one type takes in files other tools wrote (a dictionary-encoded string, a
                # "+00:00" zone), which the footers check accepted as the recorded type
                cast_options=pl.ScanCastOptions(categorical_to_string="allow", datetime_cast="convert-timezone"))
        if source.partition_by:
            # Polars' own Hive reading takes every key=value folder above the data for a column too
            parts = pl.from_arrow(partition_table(files, source, schema))
            frame = frame.join(parts.lazy(), on=FILE_COLUMN, how="left", maintain_order="left")
        return self._remember(frame.select(schema.names), schema)

    def _remember(self, frame, schema: pa.Schema):
        """Note the Arrow type each column of this stage's inputs had: a column written back as Polars
        read it is written as it was read (see _as_read). A name two inputs give different types is
        not noted."""
        for name, read in zip(schema.names, zip(schema.types, frame.collect_schema().dtypes())):
            if self._read_types.setdefault(name, read) != read:
                self._read_types[name] = None
        return frame

    # writing

    # data checks (checkplan): one aggregate query over the written version, its SQL as Polars expressions

    def check_frame(self, source: TableSource):
        return self.read(source)

    def check_measure(self, frame, plan) -> dict[str, Any]:
        return plan.values_of(frame.lazy().select(check_expressions(plan)).collect().row(0))

    def check_measure_groups(self, frame, plan) -> dict[tuple, dict[str, Any]]:
        rows = frame.lazy().group_by(list(plan.group_by)).agg(check_expressions(plan)).collect().rows()
        return plan.grouped_values(rows)

    def check_split(self, frame, plan, checks) -> tuple[Any, Any]:
        import polars as pl

        from ..definition.datachecks import CHECK_COLUMN

        labelled = frame.lazy().with_columns(pl.sql_expr(plan.sql_label(checks, "duckdb")).alias(CHECK_COLUMN))
        return (labelled.filter(pl.col(CHECK_COLUMN).is_null()).drop(CHECK_COLUMN),
                labelled.filter(pl.col(CHECK_COLUMN).is_not_null()))

    def check_head(self, frame, columns: list[str], n: int) -> list[dict[str, Any]]:
        return frame.lazy().select(columns).head(n).collect().to_dicts()

    def check_count(self, frame) -> int:
        import polars as pl

        return frame.lazy().select(pl.len()).collect().item() if hasattr(frame, "lazy") else len(frame)

    def is_frame(self, value: Any) -> bool:
        return isinstance(value, (self.pl.LazyFrame, self.pl.DataFrame))

    def write_files(self, frame: Any, directory: Path, partition_by: tuple[str, ...],
                    target_file_size: int) -> pa.Schema:
        return self._write_files(frame, directory, partition_by, target_file_size)[0]

    def write_measured(self, frame: Any, directory: Path, partition_by: tuple[str, ...],  # noqa: PLR0913 - Backend's
                       target_file_size: int, plan) -> tuple[pa.Schema, dict[str, Any] | None]:
        # a lazy output's sink and its checks' aggregate are one query of the query process, sharing
        # the stage's rows (collect_all); a frame in memory is measured there (partitioned outputs are
        # read back: their partition values come from the paths)
        if partition_by:
            return super().write_measured(frame, directory, partition_by, target_file_size, plan)
        schema, measured = self._write_files(frame, directory, (), target_file_size, plan)
        self.write_schema_file(directory, schema, ())
        return schema, measured

    def _write_files(self, frame: Any, directory: Path, partition_by: tuple[str, ...],  # noqa: PLR0913 - write_measured's
                     target_file_size: int, plan=None) -> tuple[pa.Schema, dict[str, Any] | None]:
        import pyarrow as pa

        pl = self.pl
        if self.stage_on_gpu and isinstance(frame, pl.LazyFrame):
            frame = frame.collect(engine=self._engine())  # on the GPU; the CPU sink below writes the result
        names = frame.collect_schema().names()
        missing = [name for name in partition_by if name not in names]
        if missing:
            raise DataError(f"the output has no partition column '{missing[0]}'",
                            hint="add it in the stage, or fix the dataset's partition_by")
        lazy, schema = self._standardised(frame.lazy())
        stored = pa.schema([field for field in schema if field.name not in partition_by])
        measured = None
        if isinstance(frame, pl.DataFrame):  # in memory already: its rows per file are measured exactly
            self._sink(lazy, directory, partition_by, stored, rows=_rows_per_file(pl, frame, target_file_size),
                       in_memory=True)
            if plan is not None:
                measured = measured_or_none(lambda: self.check_measure(lazy, plan))
        else:
            memory = target_file_size * MEMORY_PER_PARQUET_BYTE
            if plan is None:
                self._sink(lazy, directory, partition_by, stored, memory=memory)
            else:
                measured = self._sink_measured(lazy, directory, stored, memory, plan)
            self._split_oversized(directory, stored, target_file_size)
        respell_partition_directories(directory, partition_by)
        return standard_schema(schema), measured

    def _sink_measured(self, lazy, directory: Path, stored: pa.Schema, memory: int, plan) -> dict[str, Any] | None:
        """The sink and the checks' aggregate (its row to a file of its own) run as one query, or, where
        that query fails (a check Polars cannot evaluate, as much as the stage), the sink alone: the
        checks then measure the files, and say what failed as a check's failure, not the write's."""
        from .polarschecks import measured_aggregate, read_measured

        # one evaluation for both sinks: without it Polars runs the stage twice, and a stage that is not
        # the same each time (a sample, a random column) would be measured on rows other than those written
        lazy = lazy.cache()
        with measured_aggregate(self.pl, lazy, plan) as (aggregate, row_file):
            try:
                self._sink(lazy, directory, (), stored, memory=memory, also=aggregate)
            except self.pl.exceptions.PolarsError:
                shutil.rmtree(directory, ignore_errors=True)
                self._sink(lazy, directory, (), stored, memory=memory)
                return None
            return measured_or_none(lambda: read_measured(self, directory, stored, plan, row_file))

    def _standardised(self, lazy) -> tuple[Any, pa.Schema]:
        """The output with each column in its standard form, and the Arrow schema its files get."""
        import pyarrow as pa

        pl = self.pl
        changes = [_standard_column(pl, name, dtype) for name, dtype in lazy.collect_schema().items()]
        if any(change is not None for change in changes):
            lazy = lazy.with_columns([change for change in changes if change is not None])
        columns = lazy.collect_schema()
        written = pl.DataFrame(schema=columns).to_arrow(compat_level=pl.CompatLevel.oldest()).schema
        fields = []
        for field, dtype in zip(written, columns.dtypes()):
            read = self._read_types.get(field.name)
            same = read is not None and read[1] == dtype  # Polars holds it as it held the input column
            fields.append(pa.field(field.name, _as_read(field.type, read[0]) if same else field.type))
        return lazy, pa.schema(fields)

    def _sink(self, lazy, directory: Path, partition_by: tuple[str, ...], stored: pa.Schema,  # noqa: PLR0913
              rows: int | None = None, memory: int | None = None, in_memory: bool = False, also=None) -> None:
        """Polars' streaming Parquet sink: files of at most `rows` rows or about `memory` bytes in
        memory, under Hive-style directories when partitioned (partition columns only in the paths);
        `also`: another sink of the same rows, run in the same query (Polars computes them once)."""
        pl = self.pl
        with _quiet(pl):
            target = pl.PartitionBy(str(directory), key=list(partition_by) or None,
                                    include_key=False if partition_by else None,
                                    max_rows_per_file=rows, approximate_bytes_per_file=memory)
            query = lazy.sink_parquet(target, compression="snappy", arrow_schema=stored, mkdir=True, lazy=True,
                                      metadata=_arrow_schema_metadata(standard_schema(stored)))
        if also is not None:
            query = pl.collect_all([query, also], lazy=True)
        self._run(query, in_memory)

    def _split_oversized(self, directory: Path, stored: pa.Schema, target_file_size: int) -> None:
        """Split each file much larger than the target (data that Parquet compresses less than
        MEMORY_PER_PARQUET_BYTE supposes) into files of the target size, by its own bytes per row."""
        import pyarrow.parquet as pq

        for file in sorted(directory.rglob("*.parquet")):
            size = file.stat().st_size
            if size <= OVERSIZED * target_file_size:
                continue
            rows = pq.read_metadata(file).num_rows
            pieces = file.parent / f".{file.stem}-split"
            self._sink(self.pl.scan_parquet(file, hive_partitioning=False), pieces, (), stored,
                       rows=max(1, rows * target_file_size // size))
            for i, piece in enumerate(sorted(pieces.glob("*.parquet"))):
                piece.rename(file.with_name(f"{file.stem}-{i:05d}.parquet"))
            pieces.rmdir()
            file.unlink()


class _QueryProcess:
    """One spawned process that runs lazy queries, one at a time, so that a stopped query can be killed:
    spawned, not forked, as a fork of a process whose Polars has run a query deadlocks in Polars."""

    def __init__(self) -> None:
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        self.pid = self._pool.submit(_ready).result()  # started now: its start is the engine's

    def submit(self, plan: bytes, path: list[str]):
        return self._pool.submit(_run_plan, plan, path)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self._pool.shutdown(wait=True, cancel_futures=True)


def _ready() -> int:
    import polars  # noqa: F401 - imported before the first query, while the engine starts

    return os.getpid()


def _run_plan(plan: bytes, path: list[str]) -> None:
    """In the query process: a serialised sink, run on the streaming engine. The driver's import path
    comes along, as the plan's Python functions (a stage's map_batches) are imported by name here."""
    import io

    import polars as pl

    sys.path[:] = path
    try:
        pl.LazyFrame.deserialize(io.BytesIO(plan)).collect(engine="streaming")
    except BaseException as exc:  # noqa: BLE001 - every failure goes back, in a form that pickles
        carried = _portable(_in_own_words(exc) or exc)
        # the traceback stays here: its text goes along, for the error's place in the stage's code
        carried.add_note("".join(traceback.format_exception(exc)))
        raise carried from None


def _portable(exc: BaseException) -> BaseException:
    """An exception that comes back whole through pickle: a hybridflow error (its keyword hint does not
    pickle) as a plain carrier, another exception as it is where it pickles, else its first line."""
    if isinstance(exc, HybridflowError):
        return _Carried(type(exc), exc.message, exc.hint)
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return StageError(f"{type(exc).__name__}: {first_line(exc)}")


class _Carried(Exception):
    """A hybridflow error on its way back from the query process."""


def _arrived(exc: BaseException) -> BaseException:
    if isinstance(exc, _Carried):
        cls, message, hint = exc.args
        try:
            return cls(message, hint=hint)
        except TypeError:
            return StageError(message, hint=hint)
    return exc


def _import_paths(code: Sequence[Path]) -> list[str]:
    """The directories the stage packages (directories or .py files under the pipeline root) are
    imported from: first on the query process's path, as they are for the stage's own import."""
    return list(dict.fromkeys(str(Path(item).resolve().parent) for item in code))


def create(settings, log_dir: Path) -> PolarsBackend:
    return PolarsBackend(settings, log_dir)


def default_memory_limit() -> int:
    """Half this machine's memory, or of its container's (cgroup v2) limit where that is lower: Polars
    runs in hybridflow's own process, beside the other engines' processes."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            total = min(total, int(limit))
    return total // 2


def _configure(pl, environment: dict[str, str | None]) -> None:
    """Set (or, for None, remove) Polars' environment settings and have a running Polars reload them."""
    pl.Config.load(json.dumps({"environment": environment}))


@contextlib.contextmanager
def _quiet(pl):
    """PartitionBy, arrow_schema and cast_options are marked unstable: Polars warns on every use."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pl.exceptions.UnstableWarning)
        yield


def _arrow_schema_metadata(schema: pa.Schema) -> dict[str, str]:
    """The files' Arrow schema in the standard form that pyarrow's writer gives them: Polars records its
    own forms (large_string, large_list), which are written as the same Parquet, but readers would then
    read and record them as such. Polars writes a user's ARROW:schema in place of its own."""
    return {"ARROW:schema": base64.b64encode(schema.serialize().to_pybytes()).decode()}



def _polars_schema(pl, schema: pa.Schema):
    """The Polars schema a scan gives the columns of an Arrow schema."""
    return pl.from_arrow(schema.empty_table()).schema


def _rows_per_file(pl, frame, target_file_size: int) -> int | None:
    """Rows of an in-memory frame that make a Parquet file of about the target size (None: all of
    them); measured on a sample spread over the frame unless its memory already fits in one file."""
    if frame.estimated_size() <= target_file_size:  # Parquet never takes more than memory here
        return None
    sample = frame.gather_every(max(1, frame.height // SAMPLE_ROWS)).head(SAMPLE_ROWS)
    return rows_per_file(sample.to_arrow(compat_level=pl.CompatLevel.oldest()), target_file_size)


def _standard_column(pl, name: str, dtype):
    """The expression that writes column `name` of Polars type `dtype` in its standard form, or None
    when it already is. Raises DataError for a type no Parquet file can hold for every engine."""
    if isinstance(dtype, pl.Datetime) and dtype.time_unit == "ns":  # checked value by value
        return pl.col(name).map_batches(_in_microseconds, return_dtype=pl.Datetime("us", dtype.time_zone),
                                        is_elementwise=True)
    standard = _standard_dtype(pl, name, dtype)
    return None if standard == dtype else pl.col(name).cast(standard)


def _standard_dtype(pl, name: str, dtype):
    """`dtype` with its parts in standard form: Categorical and Enum as String, millisecond timestamps
    as microseconds (the contract's unit, as every engine writes them)."""
    if isinstance(dtype, (pl.Categorical, pl.Enum)):
        return pl.String
    if isinstance(dtype, pl.Datetime):
        if dtype.time_unit == "ns":  # only nested: a top-level column is checked value by value
            raise DataError(f"column '{name}' holds nanosecond timestamps inside a list or struct, which the "
                            "Parquet contract cannot keep", hint="cast them to microseconds in the stage")
        return pl.Datetime("us", dtype.time_zone)
    if dtype in (pl.Int128, pl.UInt128) or dtype == pl.Object:
        raise DataError(f"column '{name}': Polars {dtype} has no Parquet type that every engine reads",
                        hint="cast it to another type in the stage")
    if isinstance(dtype, pl.List):
        return pl.List(_standard_dtype(pl, name, dtype.inner))
    if isinstance(dtype, pl.Array):
        return pl.Array(_standard_dtype(pl, name, dtype.inner), dtype.shape)
    if isinstance(dtype, pl.Struct):
        return pl.Struct({field.name: _standard_dtype(pl, name, field.dtype) for field in dtype.fields})
    return dtype


def _in_microseconds(series):
    """A nanosecond timestamp column as microseconds (the contract's unit), refusing to drop digits."""
    if (series.dt.nanosecond() % 1000 != 0).any():
        raise DataError(f"column '{series.name}' holds timestamps finer than microseconds, which the Parquet "
                        "contract cannot keep", hint="round or truncate them in the stage")
    return series.dt.cast_time_unit("us")


def _as_read(written: pa.DataType, read: pa.DataType) -> pa.DataType:
    """The Arrow type a column goes to disk as, of a column that Polars holds as it held one it read
    as `read` (the caller checks that), where Polars writes it as `written`: `read`'s form where Polars
    only holds it differently (a time's unit, a fixed binary width, a zone's spelling), nested types
    part by part; Polars' own form elsewhere (large strings, lists: the same values)."""
    import pyarrow as pa

    if pa.types.is_struct(written):
        return pa.struct([pa.field(w.name, _as_read(w.type, r.type)) for w, r in zip(written, read)])
    if pa.types.is_large_list(written) and (pa.types.is_list(read) or pa.types.is_large_list(read)):
        return pa.large_list(_as_read(written.value_type, read.value_type))
    if pa.types.is_map(written):
        return pa.map_(_as_read(written.key_type, read.key_type), _as_read(written.item_type, read.item_type))
    if pa.types.is_time(read) or pa.types.is_fixed_size_binary(read) or pa.types.is_timestamp(read):
        return read
    return written


def _in_own_words(exc: BaseException) -> HybridflowError | None:
    """A Polars panic (a BaseException, which would pass every handler) as a stage error; None for
    anything else."""
    if type(exc).__name__ == "PanicException":
        return StageError(f"Polars failed inside: {first_line(exc)}")
    return None


def check_expressions(plan) -> list:
    """One Polars expression per measure of a check plan (checkplan), in the plan's order."""
    import polars as pl

    expressions = []
    for m in plan.measures:
        if m.op == "rows":
            expressions.append(pl.len().alias(m.alias))
        elif m.op == "failing":
            expressions.append(pl.sql_expr(plan.sql_predicate(m, "duckdb")).fill_null(False).sum().alias(m.alias))
        elif m.op == "max":
            expressions.append(pl.col(m.columns[0]).max().alias(m.alias))
        else:  # distinct keys, NULL a value like any other
            expressions.append(pl.struct(list(m.columns)).n_unique().alias(m.alias))
    return expressions
