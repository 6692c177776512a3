"""Spark's Backend: stages get pyspark.sql.DataFrames from a local or attached SparkSession (its conf:
conf.py), whose reads, writes, SQL and data checks it runs, and whose jobs it counts, cancels and
stops. Engine logs go to a file instead of the terminal (the runner points the JVM's output at the
run's engines.log).

With GPU stages the session loads the RAPIDS Accelerator plugin (rapids.py); each stage switches it
on or off (spark.rapids.sql.enabled), and a GPU stage's log gets the physical plan of every output,
where Gpu* operators ran on the GPU and any other operator fell back to the CPU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ... import processes
from ...data.contract import case_collisions
from ...data.footers import read_footers
from ...data.storage import ObjectPath
from ...data.tables import TableSource, parquet_files
from ...data.textfiles import csv_header
from ...engines.spark import ENGINE, SparkMaster
from ...engines.spark.objectstorage import OBJECT_STORE_WRITE, spark_path
from ...errors import DataError, UnavailableError, first_line
from ..base import Backend, measured_or_none
from ..clusterchecks import (
    check_reachable,
    driver_address,
    require_same_versions,
    require_shared_workdir,
    split_host_port,
    versions_probe,
)
from ..shippedcode import code_archive
from .classdata import class_data
from .conf import session_conf
from .filesizing import coalesced, write_sizing
from .launch import end_accumulator_server_aside, local_ip, route_query_context_logs, submitted_privately
from .lineage import nested
from .rapids import gpu_operators
from .redaction import local_event_logs, redact_event_logs
from .schemas import columns

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa


VERSIONED = ("pyarrow", "pandas", "pyspark")  # what an executor's Python must run as the driver's does
CODE_VERSION = "HYBRIDFLOW_STAGE_CODE"  # in the Python workers' environment: which stage code they import


class SparkBackend(Backend):
    name = ENGINE.name
    frame_types = ENGINE.frame_types
    writes_object_storage = True  # its workers write a version's prefix themselves

    def __init__(self, settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.master = SparkMaster.of(settings)
        self.session = None
        self._log = None  # the current stage's log
        self._first_job = 0  # the id of the running stage's first Spark job
        self.driver: str | None = None  # attached to a master on another host: the driver's address
        self._unroute = None  # puts back what route_query_context_logs changed
        self._class_data = None  # the driver JVM's class archive: mapped, or written as it exits
        self._cancelled = False  # a stage's work was cancelled: the JVM ends without writing an archive

    def start(self, code: Sequence[Path] = ()) -> None:
        if self.master.standalone:
            host, port = split_host_port(self.master.url, 7077)
            self.driver = driver_address(host, port, self.settings.advertise_address)
            check_reachable("spark", self.master.url, host, port, source=self.driver)
        from pyspark.sql import SparkSession

        if SparkSession.getActiveSession() is not None:
            # getOrCreate would silently hand back that session, whatever master we ask for
            raise UnavailableError("a SparkSession is already running in this process",
                                   hint="stop it before running a pipeline with backend: spark")
        conf = self._launch_conf()
        hidden = [*self.secrets, *filter(None, [self.settings.auth_secret])]
        secret = {k: v for k, v in conf.items() if any(value in v for value in hidden)}
        builder = SparkSession.builder.master(self.master.url)
        for key, value in conf.items():
            if key not in secret:  # pyspark puts these on the JVM's command line, which anyone can read
                builder = builder.config(key, value)
        # the JVM must not pick the host's address on its own: loopback, or the one that routes to the master
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        if self.master.local:
            # Python workers run this interpreter (its venv, its pandas), not whatever python3 is on
            # PATH; a cluster's workers run their own (PYSPARK_PYTHON names it)
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        before = processes.children()
        try:
            with warnings.catch_warnings(), submitted_privately(secret, self.log_dir), \
                    local_ip(self.driver):
                warnings.simplefilter("ignore")  # pyspark's notice about pandas 3 on import
                self.session = builder.getOrCreate()
        except BaseException as exc:
            # a stop request (or a failure) half-way through: the JVM may be launched already, its
            # process known to no one yet; it must not outlive us (nor wait to write its class archive)
            self._cancelled = True
            self.stop()
            processes.end(processes.children() - before)
            if not isinstance(exc, Exception):
                raise
            raise UnavailableError(f"spark failed to start (master {self.master}): {first_line(exc)}",
                                   hint=f"see {self.log_dir / 'engines.log'}") from exc
        self._started(code)

    def _started(self, code: Sequence[Path]) -> None:
        """The session just made: its logging, the stage code its Python workers import."""
        self.session.sparkContext.setLogLevel("ERROR")
        if self._class_data is not None:
            self._class_data.check_mapped(self.session.sparkContext._gateway.proc.pid)
        self._unroute = route_query_context_logs()
        if self.gpu is not None:  # the plugin's NOT_ON_GPU explanations are warnings: keep them
            jvm = self.session.sparkContext._jvm
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
                "com.nvidia.spark.rapids", jvm.org.apache.logging.log4j.Level.WARN)
        for path in code:  # Python UDFs run in worker processes, which import the stage modules
            self.session.sparkContext.addPyFile(str(code_archive(path, self.log_dir)))

    def _launch_conf(self) -> dict[str, str]:
        """The session's conf, with the class-data archive its driver JVM maps or writes."""
        conf = session_conf(self)
        self._class_data = class_data(conf)
        if self._class_data is not None:
            conf["spark.driver.extraJavaOptions"] += f" {self._class_data.java_options}"
        return conf

    def reload_code(self, code: Sequence[Path]) -> bool:
        if self.session is None:
            return False
        context = self.session.sparkContext
        archives = [code_archive(path, self.log_dir) for path in code]
        for archive in archives:
            if archive.name not in context._python_includes:  # the same file twice is refused
                context.addPyFile(str(archive))
        # Spark keeps Python workers per environment of the functions it runs (a reused worker keeps
        # the modules it imported): a new value here gives the next UDFs fresh workers, which find
        # the newest archive first on their sys.path
        context.environment[CODE_VERSION] = "-".join(archive.stem for archive in archives)
        return True

    def handles(self) -> dict[str, Any]:
        return {"spark": self.session}

    def check_versions(self) -> None:
        """The Python workers of the executors (one task per core the application holds)."""
        if not self.master.standalone or self.session is None:
            return
        versions = versions_probe()
        found = self._on_executors(lambda: (__import__("socket").gethostname(), versions(*VERSIONED)))
        require_same_versions("spark", self.master.url, dict(found), VERSIONED)

    def check_shared_workdir(self, workdir: Path) -> bool:
        if self.driver is None or self.session is None:
            return False
        def seen_by_executors(path: str) -> list[bool]:
            return self._on_executors(lambda: __import__("os").path.exists(path))

        require_shared_workdir("spark", self.master.url, workdir, seen_by_executors)
        return True

    def _on_executors(self, probe) -> list:
        """`probe()`'s answer from a task per core the application holds (shipped by value: it must
        import what it uses itself)."""
        context = self.session.sparkContext
        tasks = max(2, context.defaultParallelism)
        return context.parallelize(range(tasks), tasks).map(lambda _: probe()).collect()

    def begin_stage(self, on_gpu: bool, params, log) -> None:
        super().begin_stage(on_gpu, params, log)
        self._log = log
        first = self.engine_work()  # jobs are numbered from here in progress()
        if first is not None:
            self._first_job = first
        if self.gpu is not None and self.session is not None:
            self.session.conf.set("spark.rapids.sql.enabled", "true" if on_gpu else "false")

    def stage_lineage(self, run_id: str, stage: str, log):
        return nested(self.session, self.lineage, run_id, stage, log)

    def is_frame(self, value: Any) -> bool:
        from pyspark.sql import DataFrame

        return isinstance(value, DataFrame)

    def run_sql(self, query, inputs: dict[str, Any], params: dict[str, Any]) -> Any:
        # Spark's own named parameters are `:name`, as SQL stages write them
        for name, frame in inputs.items():
            frame.createOrReplaceTempView(name)
        return self.session.sql(query.text, args=params or None)

    # data checks (checkplan)

    def write_measured(self, frame: Any, directory: Path, partition_by: tuple[str, ...],  # noqa: PLR0913 - Backend's
                       target_file_size: int, plan) -> tuple[pa.Schema, dict[str, Any] | None]:
        """In object storage, every measure but distinct keys is observed by the write's own job (the
        workers there take them; no second read), distinct keys counted by a job over the key columns
        (an observation refuses DISTINCT). Local files are answered by their footers, dictionaries and
        key order at a fraction of an observation's cost (it runs uncompiled, row by row), the rest read
        back by Spark; and so are partitioned outputs, whose partition values come from the paths."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        if partition_by or not isinstance(directory, ObjectPath):
            return super().write_measured(frame, directory, partition_by, target_file_size, plan)
        aggregates = list(zip(plan.measures, plan.sql_aggregates("spark")))
        observation = Observation("hybridflow_checks")
        observed = frame.observe(observation, *[F.expr(e) for m, e in aggregates if m.op != "distinct"])
        schema = self.write(observed, directory, (), target_file_size)

        def measure() -> dict[str, Any]:
            values = observation.get
            for m, expression in aggregates:
                if m.op == "distinct":
                    source = TableSource("checked", (directory,), "parquet", schema, (), directory, self.store)
                    values[m.alias] = self.read(source).agg(F.expr(expression).alias("n")).collect()[0]["n"]
            return plan.values_of([values[m.alias] for m in plan.measures])

        return schema, measured_or_none(measure)

    def check_frame(self, source: TableSource):
        return self.read(source)

    def check_measure(self, frame, plan) -> dict[str, Any]:
        from pyspark.sql import functions as F

        return plan.values_of(frame.agg(*[F.expr(e) for e in plan.sql_aggregates("spark")]).collect()[0])

    def check_measure_groups(self, frame, plan) -> dict[tuple, dict[str, Any]]:
        from pyspark.sql import functions as F

        grouped = frame.groupBy(*[F.col(c) for c in plan.group_by])
        return plan.grouped_values(grouped.agg(*[F.expr(e) for e in plan.sql_aggregates("spark")]).collect())

    def check_split(self, frame, plan, checks) -> tuple[Any, Any]:
        from pyspark.sql import functions as F

        from ...definition.datachecks import CHECK_COLUMN

        labelled = frame.withColumn(CHECK_COLUMN, F.expr(plan.sql_label(checks, "spark")))
        return (labelled.filter(F.col(CHECK_COLUMN).isNull()).drop(CHECK_COLUMN),
                labelled.filter(F.col(CHECK_COLUMN).isNotNull()))

    def check_head(self, frame, columns: list[str], n: int) -> list[dict[str, Any]]:
        return [row.asDict() for row in frame.select(*columns).limit(n).collect()]

    def check_count(self, frame) -> int:
        return frame.count() if hasattr(frame, "count") and callable(frame.count) else len(frame)

    def read(self, source: TableSource):
        if source.schema is not None:
            ENGINE.refuse_unrepresentable(source.name, source.schema)
        elif source.format == "parquet":  # an external input without a declared schema: its footers say
            footers = read_footers(source.name, parquet_files(source), source.filesystem)
            ENGINE.refuse_unrepresentable(source.name, footers.schema)
        from pyspark.sql.pandas.types import from_arrow_schema

        reader = self.session.read
        paths = [spark_path(f) for f in source.files]
        if source.partition_by:
            # an explicit schema makes Spark parse partition values as their recorded types
            reader = reader.option("basePath", spark_path(source.base)).schema(from_arrow_schema(source.schema))
            return reader.parquet(*paths).select(*columns(source.schema.names))
        if source.format == "parquet":
            if source.schema is None:
                return reader.parquet(*paths)
            # the schema given (the footers were checked against it), Spark does not infer one: on a
            # fresh session that inference is a second of footer reading (a job beyond 32 files)
            return reader.schema(from_arrow_schema(source.schema)).parquet(*paths).select(*columns(source.schema.names))
        # text: typed as declared (or as the first blocks said) while Spark parses; a bad value fails
        # the job (FAILFAST), and the stage's error then names the file (textfiles.find_bad_value)
        reader = reader.option("mode", "FAILFAST")
        if source.format == "json":
            return reader.schema(from_arrow_schema(source.schema)).json(paths)
        return self._read_csv(reader.option("header", True), source)

    def _read_csv(self, reader, source: TableSource):
        """Spark applies a CSV schema by position: files are grouped by their header and each group
        read with the schema in its own column order, then matched by name."""
        from functools import reduce

        import pyarrow as pa
        from pyspark.sql.pandas.types import from_arrow_schema

        groups: dict[tuple[str, ...], list[str]] = {}
        for file in source.files:
            groups.setdefault(tuple(csv_header(file, source.filesystem)), []).append(spark_path(file))
        frames = []
        for header, files in groups.items():
            ordered = pa.schema([source.schema.field(name) for name in header])
            frames.append(reader.schema(from_arrow_schema(ordered)).csv(files).select(*columns(source.schema.names)))
        return reduce(lambda a, b: a.unionByName(b), frames)

    def write_files(self, frame: Any, directory: Path, partition_by: tuple[str, ...],
                    target_file_size: int) -> pa.Schema:
        from pyspark.sql.pandas.types import to_arrow_schema

        clashes = case_collisions(frame.columns)
        if clashes:
            raise DataError(f"columns {', '.join(clashes)} differ only by case, which Spark cannot hold apart",
                            hint="rename one of them")
        if self.stage_on_gpu:
            self._log_plan(frame)
        # Spark insists on creating its output directory itself; it is inside our fresh staging area.
        # In object storage a prefix is no directory: Spark writes the version's own prefix, and
        # hybridflow's manifest (which leaves out _SUCCESS) and commit are what publish it.
        remote = isinstance(directory, ObjectPath)
        target = directory if remote else directory / "_spark_output"
        # Files of a sensible size: Spark writes one file per task (and per partition value it holds).
        # Adaptive execution, told the target, coalesces the last shuffle's tasks to about that size.
        # A partitioned output is rebalanced on its partition columns, so that a value's rows meet in
        # one task (two only when larger than the target). An unpartitioned one keeps its row order:
        # its tasks are only merged (coalesce, no shuffle) down to what the plan's size estimate needs.
        if partition_by:  # the hint parses its names as expressions, partitionBy takes them literally
            rebalanced = frame.hint("rebalance", *columns(partition_by))
            writer = rebalanced.write.mode("error").partitionBy(*partition_by)
        else:
            writer = coalesced(frame, target_file_size).write.mode("error")
        with self._conf({**write_sizing(target_file_size), **(OBJECT_STORE_WRITE if remote else {})}):
            writer.parquet(spark_path(target))
        if remote:
            return to_arrow_schema(frame.schema, timezone="UTC")
        for entry in sorted(target.iterdir()):
            if entry.name.endswith(".parquet") or (entry.is_dir() and "=" in entry.name):
                entry.rename(directory / entry.name)
        shutil.rmtree(target)  # _SUCCESS: not data
        for checksum in directory.rglob(".*.crc"):
            checksum.unlink()
        return to_arrow_schema(frame.schema, timezone="UTC")

    @contextlib.contextmanager
    def _conf(self, settings: dict[str, str]):
        """Session settings for one write, the stage's own restored after it."""
        conf = self.session.conf
        saved = {key: conf.get(key, None) for key in settings}
        for key, value in settings.items():
            conf.set(key, value)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    conf.unset(key)
                else:
                    conf.set(key, value)

    def _log_plan(self, frame) -> None:
        """Which operators of this output run on the GPU, for the stage log."""
        plan = frame._sc._jvm.PythonSQLUtils.explainString(frame._jdf.queryExecution(), "simple")
        on_gpu, on_cpu = gpu_operators(plan)
        self._log.info("RAPIDS: %d operators on the GPU, %d on the CPU%s\n%s", len(on_gpu), len(on_cpu),
                       f" ({', '.join(sorted(set(on_cpu)))})" if on_cpu else "", plan)

    def engine_work(self) -> int | None:
        """Jobs run so far: Spark numbers them from 0 (the status tracker keeps the recent ones)."""
        if self.session is None:
            return None
        with contextlib.suppress(Exception):
            tracker = self.session.sparkContext.statusTracker()
            return max([*tracker.getJobIdsForGroup(None), *tracker.getActiveJobsIds()], default=-1) + 1
        return None

    def progress(self) -> str | None:
        """The stage's newest running job, counted from its first, and the tasks of its running stages
        (Spark's status tracker: a read of the driver's status store, no work for the executors)."""
        if self.session is None:
            return None
        tracker = self.session.sparkContext.statusTracker()
        jobs = tracker.getActiveJobsIds()
        if not jobs:
            return None
        # a stage whose tasks are all done stays active until the driver's listener hears it ended:
        # it is finishing, not running, and 8/8 beside the next stage's 0/4 would mislead
        stages = [info for stage in tracker.getActiveStageIds()
                  if (info := tracker.getStageInfo(stage)) and info.numCompletedTasks < info.numTasks]
        if not stages:
            return None
        return spark_progress(max(jobs) - self._first_job + 1, len(stages),
                              sum(s.numCompletedTasks for s in stages), sum(s.numTasks for s in stages))

    def cancel(self) -> None:
        self._cancelled = True
        if self.session is not None:
            self.session.sparkContext.cancelAllJobs()  # one stage at a time: all jobs are the stage's

    def stop(self) -> None:
        """Stop the session, and end the JVM: also one that a stop request caught half-started."""
        if "pyspark" not in sys.modules:
            return  # never started
        from pyspark import SparkContext

        if self.session is not None:
            event_logs = local_event_logs(self.session.sparkContext) if self.secrets else None
            end_accumulator_server_aside(self.session.sparkContext)
            self.session.stop()
            self.session = None
            if event_logs is not None:  # closed now: what Spark itself could not redact
                redact_event_logs(*event_logs, self.secrets)
        elif SparkContext._active_spark_context is not None:
            with contextlib.suppress(Exception):
                SparkContext._active_spark_context.stop()
        # spark.stop() leaves the py4j gateway JVM running until Python exits: end it now.
        gateway = SparkContext._gateway
        if gateway is not None:
            process = getattr(gateway, "proc", None)
            with contextlib.suppress(Exception):
                gateway.shutdown()
            if process is not None and self._class_data is not None:
                self._class_data.end(process, interrupted=self._cancelled)
            elif process is not None:
                process.kill()
                process.wait()
            SparkContext._gateway = None
            SparkContext._jvm = None
        if self._unroute is not None:
            self._unroute()
            self._unroute = None


def spark_progress(job: int, stages: int, done: int, total: int) -> str:
    """'job 3 · tasks 120/200', naming the number of stages when several run at once."""
    running = f" · {stages} stages" if stages > 1 else ""
    return f"job {max(job, 1)}{running} · tasks {done}/{total}"
