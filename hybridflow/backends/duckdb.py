"""DuckDB: stages get duckdb relations (one DuckDBPyRelation per input) on one in-process connection,
`ctx.duckdb`, and return a relation, a pyarrow Table or a pandas DataFrame.

The engine is one `:memory:` connection per start, in this process: no listener, no other process.
It has the CPUs this process may use, a memory limit of 75% of the machine's memory (or of its
container's limit), and spills what does not fit to a private directory under the run's logs,
removed when the engine stops (`backends.duckdb` sets all three). Session time zone UTC, so a
timestamp with a time zone comes back to Arrow as UTC, as it is on disk.

Relations are lazy: a stage's query runs when hybridflow writes its output, with DuckDB's own
Parquet writer (COPY ... TO, parallel, in files of the target size, Hive-style when partitioned).
DuckDB types without a lossless Parquet twin are cast to the type DuckDB's Arrow export gives them
(HUGEINT to decimal(38,0), UUID to string, ...) or refused with the column named; nanosecond
timestamps are written as microseconds only where no value has finer digits. A timeout or a stop
request interrupts the running query (`interrupt()`); progress is DuckDB's own query percentage.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, Sequence
from urllib.parse import unquote

from ..data.contract import standard_schema
from ..data.footers import read_footers
from ..data.storage import uri_of
from ..data.tables import (
    FILE_COLUMN,
    TableSource,
    hive_escape,
    parquet_files,
    partition_table,
    text_dataset,
    with_string_partitions,
    write_arrow,
)
from ..engines.duckdb import ENGINE, DuckDBSettings
from ..errors import DataError, HybridflowError, StageError, UnavailableError, first_line
from .base import Backend
from .checkplan import ROWS
from .stagelog import private_dir

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa





class DuckDBBackend(Backend):
    name = ENGINE.name
    frame_types = ENGINE.frame_types

    def __init__(self, settings: DuckDBSettings | None, log_dir: Path) -> None:
        self.settings = settings or DuckDBSettings()
        self.log_dir = log_dir
        self.con = None
        self._spill: Path | None = None  # the spill directory this backend made (removed at stop)
        self._threads_started = False
        self._stores: set = set()  # object stores whose filesystem the connection has

    def start(self, code: Sequence[Path] = ()) -> None:
        import duckdb

        spill = self.settings.temp_directory
        if spill is None:
            spill = self._spill = private_dir(self.log_dir / "duckdb-spill")
        # one thread for now: DuckDB's workers are threads of the thread that sizes its pool, and an
        # early start runs in a thread of lowered CPU priority (begin_stage sizes it, in the main thread)
        config = {"threads": 1,
                  "memory_limit": f"{self.settings.memory_limit or default_memory_limit()}B",
                  "temp_directory": str(spill),
                  "autoinstall_known_extensions": False}  # an unattended run never downloads code
        try:
            self.con = duckdb.connect(":memory:", config=config)
            for statement in SESSION:
                self.con.execute(statement)
        except duckdb.Error as exc:
            self.stop()
            raise UnavailableError(f"duckdb failed to start: {first_line(exc)}",
                                   hint="check backends.duckdb in the pipeline file") from exc

    def reload_code(self, code) -> bool:
        return True  # stages run in this process, which imports the changed modules again

    def begin_stage(self, on_gpu: bool, params, log) -> None:
        super().begin_stage(on_gpu, params, log)
        if not self._threads_started:
            self.con.execute(f"SET threads = {int(self.settings.threads or _usable_cpus())}")
            self._threads_started = True

    def handles(self) -> dict[str, Any]:
        return {"duckdb": self.con}

    def run_sql(self, query, inputs: dict[str, Any], params: dict[str, Any]) -> Any:
        """A SQL stage: each input a view named after its dataset; `:name` params written as DuckDB's
        `$name` and bound by DuckDB. The result is a lazy relation, run when its output is written."""
        for name, relation in inputs.items():
            relation.create_view(name, replace=True)
        return self.con.sql(query.with_params_as("$"), params=params or None)

    def progress(self) -> str | None:
        """DuckDB's own estimate of the running query's progress; nothing between queries."""
        if self.con is None:
            return None
        done = self.con.query_progress()
        return f"query {done:.0f}%" if done >= 0 else None

    def cancel(self) -> None:
        if self.con is not None:
            self.con.interrupt()  # the running query raises InterruptException in the stage's thread

    def stop(self) -> None:
        if self.con is not None:
            with contextlib.suppress(Exception):
                self.con.interrupt()  # a query still running (a stage abandoned by its timeout) ends first
            with contextlib.suppress(Exception):
                self.con.close()
            self.con = None
            self._stores.clear()
        if self._spill is not None:
            shutil.rmtree(self._spill, ignore_errors=True)
            self._spill = None

    # reading

    def read(self, source: TableSource):
        if source.schema is not None:
            ENGINE.refuse_unrepresentable(source.name, source.schema)
        if source.format != "parquet":
            return self.con.from_arrow(text_dataset(source))
        files = parquet_files(source)
        if not files and source.schema is not None:  # a partitioned input with no partition chosen
            return self.con.from_arrow(source.schema.empty_table())
        if source.partition_by:
            return self._read_partitioned(source, files)
        if source.store is not None:
            # objects through pyarrow's S3 reader, scanned lazily (columns and filters pushed down):
            # half the time of DuckDB's reads through fsspec
            import pyarrow.dataset as ds

            return self.con.from_arrow(ds.dataset([str(f) for f in files], format="parquet",
                                                  filesystem=source.filesystem, schema=source.schema))
        relation = self.con.read_parquet(self._paths(source, files), hive_partitioning=False)
        if source.schema is not None and relation.columns != source.schema.names:
            relation = relation.project(column_list(source.schema.names))  # the recorded order
        return relation

    def _paths(self, source: TableSource, files: list[PurePath]) -> list[str]:
        """The files as DuckDB's scans name them; objects through fsspec's wrapper of pyarrow's S3,
        registered with the connection once (DuckDB's own S3 reader is an extension it would download)."""
        if source.store is not None and source.store not in self._stores:
            self.con.register_filesystem(source.store.fsspec_filesystem())
            self._stores.add(source.store)
        return [uri_of(f) for f in files]

    def _read_partitioned(self, source: TableSource, files: list[PurePath]):
        """The files' columns joined, by file, to the partition values of its path: parsed and typed as
        every engine does (tables.partition_values), where DuckDB's own Hive reading also takes every
        key=value folder above the data for a column, and reads a value spelt NULL as a null."""
        schema = source.schema or with_string_partitions(read_footers(source.name, files, source.filesystem).schema,
                                                          source.partition_by)
        stored = [name for name in schema.names if name not in source.partition_by]
        paths = sql_list(self._paths(source, files))
        data = self.con.sql(f"SELECT {column_list([*stored, FILE_COLUMN])} FROM read_parquet({paths}, "
                            f"filename={sql_string(FILE_COLUMN)}, hive_partitioning=false)")
        parts = self.con.from_arrow(partition_table(files, source, schema))
        return data.join(parts, FILE_COLUMN).project(column_list(schema.names))

    # writing

    def is_frame(self, value: Any) -> bool:
        import duckdb
        import pyarrow as pa

        if isinstance(value, (duckdb.DuckDBPyRelation, pa.Table, pa.RecordBatchReader)):
            return True
        # a DataFrame exists only once its stage imported pandas: never imported here for a relation
        pandas = sys.modules.get("pandas")
        return pandas is not None and isinstance(value, pandas.DataFrame)

    def write_files(self, frame: Any, directory: Path, partition_by: tuple[str, ...],
                    target_file_size: int) -> pa.Schema:
        import duckdb

        if not isinstance(frame, duckdb.DuckDBPyRelation):
            return write_arrow(_as_arrow(frame), directory, partition_by, target_file_size)
        missing = [name for name in partition_by if name not in frame.columns]
        if missing:
            raise DataError(f"the output has no partition column '{missing[0]}'",
                            hint="select it in the stage's query, or fix the dataset's partition_by")
        relation = frame.project(", ".join(map(write_expression, frame.columns, frame.types)))
        try:
            relation.write_parquet(str(directory), compression="snappy", partition_by=list(partition_by) or None,
                                   file_size_bytes=target_file_size, filename_pattern="part-{i}",
                                   per_thread_output=False)
        except duckdb.Error as exc:
            known = _in_own_words(exc)
            if known is None:
                raise
            raise known from exc
        respell_partition_directories(directory, partition_by)
        return (None if partition_by else footer_schema(directory)) or arrow_schema(relation)


    # data checks (checkplan): one aggregate query over the relation

    def check_frame(self, source: TableSource):
        return self.read(source)

    def check_measure(self, frame, plan) -> dict[str, Any]:
        # A unique check's keys that each rise above the row's before (lag over the scan, streamed, in a
        # query of their own: a streamed window runs on one thread) are distinct: counted by hashing
        # (COUNT DISTINCT, most of the checks' cost) only where they do not.
        rising = [m for m in plan.measures if m.op == "distinct" and not m.hashed and _ordered_types(frame, m.columns)]
        aggregates = ["NULL" if m in rising else plan.sql_aggregate(m, "duckdb") for m in plan.measures]
        values = plan.values_of(frame.aggregate(", ".join(f"{a} AS {m.alias}" for a, m in
                                                          zip(aggregates, plan.measures))).fetchall()[0])
        unproven = [m for m in rising if _unproven_rows(frame, m.columns)]
        counted = frame.aggregate(", ".join(f"{plan.sql_aggregate(m, 'duckdb')} AS {m.alias}" for m in unproven)) \
            .fetchall()[0] if unproven else ()
        return values | {m.alias: values[ROWS] for m in rising} | \
            {m.alias: int(count) for m, count in zip(unproven, counted)}

    def check_measure_groups(self, frame, plan) -> dict[tuple, dict[str, Any]]:
        keys = column_list(plan.group_by)
        return plan.grouped_values(frame.aggregate(", ".join([keys, *plan.sql_aggregates("duckdb")]), keys).fetchall())

    def check_split(self, frame, plan, checks) -> tuple[Any, Any]:
        from ..definition.datachecks import CHECK_COLUMN

        labelled = frame.project(f"*, {plan.sql_label(checks, 'duckdb')} AS {quote(CHECK_COLUMN)}")
        return (labelled.filter(f"{quote(CHECK_COLUMN)} IS NULL").project(column_list(frame.columns)),
                labelled.filter(f"{quote(CHECK_COLUMN)} IS NOT NULL"))

    def check_head(self, frame, columns: list[str], n: int) -> list[dict[str, Any]]:
        return [dict(zip(columns, row)) for row in frame.project(column_list(columns)).limit(n).fetchall()]

    def check_count(self, frame) -> int:
        return frame.aggregate("count(*)").fetchall()[0][0] if hasattr(frame, "aggregate") else len(frame)


# DuckDB types whose values a row-by-row comparison orders as COUNT(DISTINCT) tells them apart
ORDERED_TYPES = {"boolean", "tinyint", "smallint", "integer", "bigint", "utinyint", "usmallint", "uinteger",
                 "ubigint", "hugeint", "uhugeint", "float", "double", "decimal", "varchar", "date", "time",
                 "timestamp", "timestamp with time zone", "timestamp_s", "timestamp_ms", "timestamp_ns", "uuid"}


def _ordered_types(frame, columns: tuple[str, ...]) -> bool:
    kinds = dict(zip(frame.columns, frame.types))
    return all(column in kinds and kinds[column].id in ORDERED_TYPES for column in columns)


def _unproven_rows(frame, columns: tuple[str, ...]) -> int:
    """Rows with a NULL in the key, or whose key is not above the previous row's (compared column after
    column): 0 proves every key distinct."""
    previous = {c: quote(f"hf_previous_{i}") for i, c in enumerate(columns)}
    lagged = frame.project(", ".join([column_list(columns), *(f"lag({quote(c)}) OVER () AS {previous[c]}"
                                                             for c in columns)]))
    above = None
    for column in reversed(columns):
        greater = f"{quote(column)} > {previous[column]}"
        above = greater if above is None else f"({greater} OR ({quote(column)} = {previous[column]} AND {above}))"
    nulls = " OR ".join(f"{quote(c)} IS NULL" for c in columns)
    return lagged.aggregate(f"count(*) FILTER (WHERE {nulls} OR ({previous[columns[0]]} IS NOT NULL "
                            f"AND NOT {above}))").fetchall()[0][0]


SESSION = ("SET TimeZone = 'UTC'",  # TIMESTAMPTZ reaches Arrow as UTC, as on disk, whatever the machine's zone
           "SET enable_progress_bar = true",  # keeps the query progress that progress() reads
           "SET enable_progress_bar_print = false")


def create(settings, log_dir: Path) -> DuckDBBackend:
    return DuckDBBackend(settings, log_dir)


def _usable_cpus() -> int:
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_memory_limit() -> int:
    """75% of this machine's memory, or of its container's (cgroup v2) limit where that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            total = min(total, int(limit))
    return total * 3 // 4



# SQL text

def quote(name: str) -> str:
    """A column name as a DuckDB identifier, whatever it holds (dots, spaces, quotes, unicode)."""
    return '"' + name.replace('"', '""') + '"'


def column_list(names: Sequence[str]) -> str:
    return ", ".join(quote(name) for name in names)


def sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def sql_list(texts: Sequence[str]) -> str:
    return "[" + ", ".join(sql_string(t) for t in texts) + "]"


# writing helpers

# DuckDB types whose Parquet form is not what every engine reads back as the same Arrow type: cast to
# the type DuckDB's own Arrow export gives them (COPY wrote HUGEINT as a lossy double, UUID and JSON as
# Arrow extension types, seconds and milliseconds timestamps in their own units, ENUM as a dictionary).
CASTS = {"hugeint": "DECIMAL(38,0)", "uhugeint": "DECIMAL(38,0)", "uuid": "VARCHAR", "bignum": "VARCHAR",
         "varint": "VARCHAR", "enum": "VARCHAR", "timestamp_s": "TIMESTAMP", "timestamp_ms": "TIMESTAMP"}
NANOSECONDS = {"timestamp_ns": "TIMESTAMP", "timestamptz_ns": "TIMESTAMPTZ"}
REFUSED = {"interval": "INTERVAL has no Parquet type that every engine reads",
           "time with time zone": "TIME WITH TIME ZONE would lose its offset in Parquet",
           "bit": "BIT has no Parquet type", "union": "UNION has no Parquet type"}


def write_expression(name: str, kind) -> str:
    """The select-list entry that writes column `name` of DuckDB type `kind` losslessly, as an optional
    Parquet column: DuckDB writes a column as required where its statistics say it has no null (an
    input file's, a constant's), which would make files of one dataset differ in schema by their data
    (new partitions beside kept ones), and a CASE that may give null is what it cannot prove non-null."""
    column = quote(name)
    if kind.id in NANOSECONDS:  # microseconds on disk (the contract), refusing to drop nanoseconds
        message = sql_string(f"hybridflow: column '{name}' holds timestamps finer than microseconds, which the "
                             "Parquet contract cannot keep; round or truncate them in the stage")
        return (f"CASE WHEN {column} IS NULL THEN NULL WHEN epoch_ns({column}) % 1000 <> 0 THEN error({message}) "
                f"ELSE CAST({column} AS {NANOSECONDS[kind.id]}) END AS {column}")
    target, changed = written_type(name, kind)
    value = f"CAST({column} AS {target})" if changed else column
    return f"CASE WHEN {column} IS NULL THEN NULL ELSE {value} END AS {column}"


def written_type(name: str, kind) -> tuple[str, bool]:
    """(the DuckDB type column `name` is written as, whether that differs from `kind`), nested types
    rebuilt around their children's. Raises DataError for a type no Parquet file can hold exactly."""
    type_id = kind.id
    if type_id in REFUSED or type_id in NANOSECONDS:
        reason = REFUSED.get(type_id, "nanosecond timestamps inside nested types cannot be checked for "
                                      "sub-microsecond digits")
        raise DataError(f"column '{name}': {reason}", hint="cast it to another type in the stage's query")
    if type_id in CASTS or str(kind) == "JSON":
        return CASTS.get(type_id, "VARCHAR"), True
    if type_id in ("list", "array"):  # a fixed-size ARRAY is written as a LIST: what Parquet has
        child, changed = written_type(name, dict(kind.children)["child"])
        return f"{child}[]", changed or type_id == "array"
    if type_id == "struct":
        fields = [(field, *written_type(name, child)) for field, child in kind.children]
        return (f"STRUCT({', '.join(f'{quote(field)} {text}' for field, text, _ in fields)})",
                any(changed for _, _, changed in fields))
    if type_id == "map":
        (key, key_changed), (value, value_changed) = (written_type(name, child) for _, child in kind.children)
        return f"MAP({key}, {value})", key_changed or value_changed
    return str(kind), False


def arrow_schema(relation) -> pa.Schema:
    """The relation's Arrow schema (of its types as written), from a query that returns no row."""
    import pyarrow as pa

    reader = pa.RecordBatchReader.from_stream(relation.limit(0))
    try:
        return standard_schema(reader.schema.remove_metadata())
    finally:
        reader.read_all()  # the connection holds one open result at a time: drain it
        reader.close()


def footer_schema(directory: Path) -> pa.Schema | None:
    """The schema of an unpartitioned output DuckDB just wrote, from its first file's footer (None when
    it wrote none): what the output's manifest records from the footers anyway, read in a few KB where
    arrow_schema would bind and run the stage's query plan once more."""
    import pyarrow.parquet as pq

    first = min(directory.glob("*.parquet"), default=None)
    return None if first is None else standard_schema(pq.read_schema(first).remove_metadata())


def respell_partition_directories(directory: Path, partition_by: tuple[str, ...]) -> None:
    """DuckDB percent-encodes every byte of a partition key and value outside [A-Za-z0-9._~-]; every
    engine names and reads the directories as Spark does (tables.hive_escape)."""
    for level in range(len(partition_by)):
        for path in sorted(directory.glob("/".join(["*"] * (level + 1)))):
            key, sep, value = path.name.partition("=")
            if not (path.is_dir() and sep):
                continue
            spelled = f"{hive_escape(unquote(key))}={hive_escape(unquote(value))}"
            if spelled != path.name:
                path.rename(path.with_name(spelled))


def _as_arrow(frame) -> pa.Table:
    import pyarrow as pa

    if isinstance(frame, pa.Table):
        return frame
    if isinstance(frame, pa.RecordBatchReader):  # what a DuckDB relation's .arrow() returns since 2.0
        return frame.read_all()
    from . import pandas_frames  # pandas: imported when a stage returns a frame

    return pandas_frames.to_arrow(frame)


_UDF_FAILURE = re.compile(r"Python exception occurred while executing the UDF: (.+)", re.DOTALL)


def _in_own_words(exc: Exception) -> HybridflowError | None:
    """A failed write as hybridflow tells it, or None: a refused value as a data error, an exception
    raised in a Python UDF as the user's own (DuckDB keeps only its text)."""
    text = str(exc)
    if "hybridflow: " in text:
        return DataError(first_line(text.split("hybridflow: ", 1)[1]),
                         hint="round or truncate the timestamps in the stage")
    raised = _UDF_FAILURE.search(text)
    if raised:
        return StageError(f"{first_line(raised.group(1))} (in a Python function that DuckDB called; DuckDB "
                          "keeps no traceback of it)")
    return None
