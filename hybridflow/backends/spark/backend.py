"""Spark: stages get pyspark.sql.DataFrames from a local or attached SparkSession.

Defaults close Spark's traps for a lossless hand-off : timestamps
written as TIMESTAMP_MICROS instead of INT96, the session time zone pinned to UTC, the UI off,
everything bound to 127.0.0.1 (attached to a master on another host: the driver binds to and
advertises the one local address that routes there, or backends.spark.advertise_address), shuffle
partitions sized to the machine, and engine logs sent to a file instead of the terminal (the runner
points the JVM's output at the run's engines.log).

With GPU stages the session loads the RAPIDS Accelerator plugin (see spark_gpu_conf); each stage
switches it on or off (spark.rapids.sql.enabled), and a GPU stage's log gets the physical plan of
every output, where Gpu* operators ran on the GPU and any other operator fell back to the CPU.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
import warnings
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from pydantic import Field, model_validator

from ... import processes
from ...data.footers import read_footers
from ...data.storage import ObjectPath
from ...data.tables import TableSource, parquet_files
from ...data.textfiles import csv_header
from ...errors import DataError, UnavailableError, first_line
from ...settings import EngineSection, GpuMode, Params
from .. import ClusterLaunch, Engine, GpuPlugin
from ..base import Backend, measured_or_none
from ..clusterchecks import (
    check_reachable,
    driver_address,
    require_same_versions,
    require_shared_workdir,
    split_host_port,
    versions_probe,
)
from ..engineoutput import engine_output_stream
from ..framerules import case_collisions
from ..shippedcode import code_archive
from . import host
from .lineage import listener_classpath, nested

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa


class SparkSettings(EngineSection):
    cluster_address_field: ClassVar[str | None] = "master"
    master: str | None = Field(None, description="local[N] or spark://host:7077; default local[*]")
    conf: Params = Field(default_factory=dict, description="Spark configuration, e.g. spark.sql.shuffle.partitions")
    gpu: GpuMode = False
    rapids_jar: str | None = None
    advertise_address: str | None = Field(
        None, description="attached to a master on another host: the address of this host its executors "
                          "connect back to (default: the one that routes to the master)")
    remote: str | None = Field(None, description="a Spark Connect server to attach to: sc://host:15002 (Spark 4 "
                                                 "clusters, Databricks); instead of master")
    token: str | None = Field(None, description="the Spark Connect bearer token (from ${env:...}); over TLS "
                                                "unless the server is on localhost")
    auth_secret: str | None = Field(None, description="attached to a master with spark.authenticate: its shared "
                                                      "secret (from ${env:...}); traffic encrypted with it")

    @model_validator(mode="after")
    def _one_way_to_spark(self):
        if self.remote and (self.master or self.cluster):
            raise ValueError(f"remote: attaches through Spark Connect and {'master' if self.master else 'cluster'}: "
                             "names another Spark: keep one of them")
        if self.remote and not self.remote.startswith("sc://"):
            raise ValueError(f"remote must be a Spark Connect address, sc://host:port, not {self.remote!r}")
        if self.token and not self.remote:
            raise ValueError("token: is for a Spark Connect server (remote: sc://host:port)")
        return self


def _attached(settings: SparkSettings) -> bool:
    return bool(settings.remote) or not (settings.master or "local").startswith("local")


# the stage `hybridflow init` writes for this engine ({input}: the dataset it reads)
EXAMPLE_STAGE = '''"""Column work on Spark: a Spark DataFrame in and out (a `ctx` parameter would give the session)."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def in_cents({input}: DataFrame) -> DataFrame:
    return {input}.withColumn("amount_cents", F.round(F.col("amount") * 100).cast("long"))
'''

# spark-class of the pyspark the hosts' Python imports (its launcher scripts ship in the wheel)
_SPARK_CLASS = ("import os, sys, pyspark; bin = os.path.join(os.path.dirname(pyspark.__file__), 'bin'); "
                "os.execv(os.path.join(bin, 'spark-class'), ['spark-class', *sys.argv[1:]])")


def cluster_launch(python: str, head: str, port: int | None, name: str, idle_timeout: float,
                   scratch: str = "") -> ClusterLaunch:
    """A standalone master and workers, each bound to its host's address, authenticated with a secret
    made for the cluster (spark.authenticate, its traffic encrypted), the web UIs, which cannot be
    turned off, bound to loopback (SPARK_LOCAL_IP) on a free port, the workers' scratch in the
    cluster's private folder."""
    import secrets

    port = port or 7077
    secret = secrets.token_hex(32)
    properties = f"{scratch}/spark-auth.properties"

    def spark_class(*args: str) -> list[str]:
        return ["env", "SPARK_LOCAL_IP=127.0.0.1", f"SPARK_LOCAL_DIRS={scratch}/spark-local",
                f"PYSPARK_PYTHON={python}", python, "-c", _SPARK_CLASS, *args, "--webui-port", "0",
                "--properties-file", properties]

    return ClusterLaunch(
        f"spark://{head}:{port}", port,
        spark_class("org.apache.spark.deploy.master.Master", "--host", head, "--port", str(port)),
        lambda host: spark_class("org.apache.spark.deploy.worker.Worker", f"spark://{head}:{port}",
                                 "--host", host, "--work-dir", f"{scratch}/spark-work"),
        files={"spark-auth.properties": "".join(f"{key}={value}\n" for key, value in auth_conf(secret).items())},
        attach={"auth_secret": secret}, secrets=(secret,),
        head_ready="Starting Spark master at", joined="Successfully registered with master")


def auth_conf(secret: str) -> dict[str, str]:
    """What a master, its workers and the application share: the secret, and encryption with it."""
    return {"spark.authenticate": "true", "spark.authenticate.secret": secret,
            "spark.network.crypto.enabled": "true", "spark.master.rest.enabled": "false"}


ENGINE = Engine(
    name="spark", module=__name__, example=(EXAMPLE_STAGE, "in_cents"),
    settings=SparkSettings, description="Spark: a local session or a cluster's master",
    frame_types="pyspark.sql.DataFrame", requires=("pyspark",), extra="spark", distributions=("pyspark",),
    doctor=host.doctor_checks, environment=("JAVA_HOME",),
    gpu=True, gpu_plugin=GpuPlugin("Spark RAPIDS jar", "the RAPIDS Accelerator jar for Spark",
                                   host.find_rapids_jar, host.JAR_HINT),
    attached=_attached, sql_dialect="spark",
    result_settings=lambda settings: {"spark_conf": dict(settings.conf)},
    unrepresentable=lambda schema: unrepresentable(schema),
    object_storage_check=lambda: _s3_jars().check(),
    object_storage_fetch=lambda settings: _fetch_s3_jars(settings),
    cluster_launch=cluster_launch,
)


def default_conf(master: str, driver: str = "127.0.0.1") -> dict[str, str]:
    """`driver`: the address the driver binds to and tells the executors to connect back to."""
    cores = os.cpu_count() or 2
    local = {"spark.driver.memory": local_driver_memory()} if master.startswith("local") else {}
    return {
        **local,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": driver,
        "spark.driver.bindAddress": driver,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
        "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
        "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
        "spark.sql.shuffle.partitions": str(max(2, cores * 2)),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.caseSensitive": "false",
        "spark.app.name": "hybridflow",
    }


def local_driver_memory() -> str:
    """The heap of an embedded Spark, whose driver is also its only executor: a quarter of this
    machine's memory, 1 to 16 GiB. Spark's own 1 GiB default runs out on ordinary wide tables
    (the Parquet writer buffers every column: 10,000 columns need several GiB)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return "1g"
    return f"{min(16, max(1, total // 4 // 2**30))}g"


RAPIDS_PLUGIN = "com.nvidia.spark.SQLPlugin"


# Spark's own default: conf keys (or values) matching it show as *********(redacted) in the UI,
# event logs and its own logs.
SPARK_REDACTION_DEFAULT = r"(?i)secret|password|token|access[.]key"


def redaction_conf(conf: dict[str, str], secrets) -> dict[str, str]:
    """Conf that makes Spark redact the pipeline's secret values wherever it records conf (the event
    log a user turns on, the UI's environment page, its logs) and in the plans and options it writes
    out (a secret in a read option, a SQL string). Spark redacts an entry whose key or value matches
    spark.redaction.regex, so the values themselves are added to it, quoted."""
    if not secrets:
        return {}
    values = "|".join(r"\Q" + value.replace(r"\E", r"\E\\E\Q") + r"\E"
                      for value in sorted(secrets, key=len, reverse=True))
    keys = conf.get("spark.redaction.regex", SPARK_REDACTION_DEFAULT)
    strings = conf.get("spark.redaction.string.regex")
    return {"spark.redaction.regex": f"{keys}|{values}",
            "spark.redaction.string.regex": f"{strings}|{values}" if strings else values}


@contextlib.contextmanager
def _submitted_privately(conf: dict[str, str], scratch: Path):
    """Conf holding a secret reaches the JVM through a properties file readable by the owner only,
    removed once the JVM has read it at launch, instead of through the command line (world-readable
    in /proc) where pyspark puts every other conf entry."""
    if not conf:
        yield
        return
    scratch.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="spark-conf-", suffix=".properties", dir=scratch)  # 0600
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.writelines(f"{_property(key, True)}={_property(value, False)}\n" for key, value in conf.items())
    previous = os.environ.get("PYSPARK_SUBMIT_ARGS")
    try:
        with _environment("PYSPARK_SUBMIT_ARGS",
                          f"--properties-file {shlex.quote(path)} {previous or 'pyspark-shell'}"):
            yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _event_logs(context) -> tuple[Path, str] | None:
    """Where this application's event log goes, when it is on and local: (directory, app id)."""
    conf = context.getConf()
    if conf.get("spark.eventLog.enabled", "false").lower() != "true":
        return None
    where = conf.get("spark.eventLog.dir", "/tmp/spark-events")
    if "://" in where and not where.startswith("file:"):
        return None  # HDFS, S3: not ours to rewrite
    return Path(where.removeprefix("file://").removeprefix("file:")), context.applicationId


def redact_event_logs(directory: Path, app_id: str, secrets) -> None:
    """Spark redacts conf values (see redaction_conf) but not what a failed task's error or a query
    plan quotes; an uncompressed event log of this application is rewritten with the secrets
    replaced, atomically. A compressed one is left as it is (the README says so)."""
    from ...definition.pipeline import REDACTED

    needles = sorted({v for value in secrets for v in (value, json.dumps(value)[1:-1])}, key=len, reverse=True)
    for path in sorted(directory.glob(f"*{app_id}*")):
        for file in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
            if file.suffix in (".zstd", ".lz4", ".snappy", ".lzf"):
                continue
            data = original = file.read_bytes()
            for needle in needles:
                data = data.replace(needle.encode(), REDACTED.encode())
            if data != original:
                partial = file.with_name(f".{file.name}.redacting")
                partial.write_bytes(data)
                os.chmod(partial, file.stat().st_mode & 0o777)
                os.replace(partial, file)


def _property(text: str, is_key: bool) -> str:
    """`text` escaped for a Java properties file (Spark reads it as UTF-8)."""
    text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if is_key:
        return text.replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ")
    return "\\" + text if text.startswith(" ") else text


def spark_path(path: PurePath) -> str:
    """A file as Spark names it: s3a://bucket/key for an object (hadoop-aws's scheme), else the path."""
    return f"s3a://{path}" if isinstance(path, ObjectPath) else str(path)


def _names_hadoop_aws(own: dict[str, str]) -> bool:
    """The pipeline's own conf brings the s3a connector: hybridflow adds none."""
    return any("hadoop-aws" in own.get(key, "") for key in ("spark.jars", "spark.jars.packages",
                                                             "spark.driver.extraClassPath"))


def _s3_jars():
    """The s3a jars' fetcher, imported when a run reaches object storage: it brings http, ssl and xml
    (10 ms), which every other command (validate, a local run) loads the Spark engine's module without."""
    from . import s3_jars

    return s3_jars


def _fetch_s3_jars(settings) -> None:
    """Before a run whose driver will need the s3a jars: fetched now, once per machine (a Spark Connect
    server reaches object storage with its own)."""
    if settings.remote or _names_hadoop_aws({k: str(v) for k, v in settings.conf.items()}):
        return
    _s3_jars().s3_jars()


def spark_s3_conf(store, own: dict[str, str], gpu_conf: dict[str, str]) -> dict[str, str]:
    """What Spark needs to read s3:// paths: hadoop-aws and the AWS SDK on its classpath (unless the
    pipeline's own conf brings them), and the endpoint, region and addressing every engine is given
    (credentials: s3a's default chain reads the AWS variables and profile)."""
    conf = store.spark_conf()
    if _names_hadoop_aws(own):
        return conf
    jars = [str(jar) for jar in _s3_jars().s3_jars()]  # fetched here the first time
    # on the classpath where they lie (on a cluster, every worker has them under the same path: `python
    # -m hybridflow.backends.spark_s3_jars` there): spark.jars would copy 700 MB to each executor
    for key in ("spark.driver.extraClassPath", "spark.executor.extraClassPath"):
        conf[key] = ":".join([*filter(None, [gpu_conf.get(key)]), *jars])
    return conf


def spark_gpu_conf(settings, jar: Path) -> dict[str, str]:
    """The RAPIDS Accelerator's settings (docs: getting-started-on-prem, configs). The plugin uses one GPU
    per executor. Local mode shares the machine's GPU and must not ask Spark for GPU resources (it cannot
    schedule them there and waits forever); a cluster's executors each ask for one GPU, shared by their
    tasks (task amount 1/executor cores). The pipeline's own conf overrides any of these."""
    conf = {
        "spark.plugins": RAPIDS_PLUGIN,
        "spark.jars": str(jar),
        "spark.driver.extraClassPath": str(jar),  # pyspark starts the driver JVM with this conf
        "spark.rapids.sql.enabled": "true",
        "spark.rapids.sql.explain": "NOT_ON_GPU",  # why an operator stayed on the CPU, in engines.log
        "spark.rapids.sql.concurrentGpuTasks": "1",
        "spark.rapids.memory.pinnedPool.size": "2g",  # pinned host memory for host <-> GPU copies
        "spark.locality.wait": "0s",
        "spark.sql.files.maxPartitionBytes": "512m",
    }
    master = settings.master or "local[*]"
    if not master.startswith("local"):
        cores = settings.conf.get("spark.executor.cores")
        conf["spark.executor.resource.gpu.amount"] = "1"
        conf["spark.task.resource.gpu.amount"] = f"{1 / int(cores):.4g}" if cores else "0.25"
    return conf


def gpu_operators(plan: str) -> tuple[list[str], list[str]]:
    """The operators of a physical plan (explain output) on the GPU (Gpu*), and the others."""
    names = []
    for line in plan.split("== Physical Plan ==")[-1].splitlines():
        # tree drawing, then whole-stage codegen's "*(1) ", then the operator's name
        match = re.match(r"[\s+\-:|!*]*(?:\(\d+\)\s*)?([A-Z][A-Za-z0-9]*)", line)
        if match and match.group(1) not in ("AdaptiveSparkPlan", "Subquery", "ReusedSubquery"):
            names.append(match.group(1))
    return [n for n in names if n.startswith("Gpu")], [n for n in names if not n.startswith("Gpu")]


VERSIONED = ("pyarrow", "pandas", "pyspark")  # what an executor's Python must run as the driver's does
CODE_VERSION = "HYBRIDFLOW_STAGE_CODE"  # in the Python workers' environment: which stage code they import


# The driver JVM (in local mode, every task's too) compiles with C2 only code that stays hot (30 times
# HotSpot's thresholds): a run's JVM is young, and compiling code that runs a few thousand times took a
# third of its CPU; long stages reach C2 all the same (docs/benchmarks.md, "Engine settings").
DRIVER_JIT = ("-XX:Tier4InvocationThreshold=150000 -XX:Tier4MinInvocationThreshold=18000 "
              "-XX:Tier4CompileThreshold=450000 -XX:Tier4BackEdgeThreshold=1200000")


class SparkBackend(Backend):
    name = ENGINE.name
    frame_types = ENGINE.frame_types
    writes_object_storage = True  # its workers write a version's prefix themselves

    def __init__(self, settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.master = settings.master or "local[*]"
        self.session = None
        self._log = None  # the current stage's log
        self._first_job = 0  # the id of the running stage's first Spark job
        self._driver: str | None = None  # attached to a master on another host: the driver's address
        self._unroute = None  # puts back what _route_query_context_logs changed

    def _session_conf(self) -> dict[str, str]:
        """The session's conf: ours, the GPU plug-in's, object storage's, then the pipeline's own."""
        gpu_conf = spark_gpu_conf(self.settings, self.gpu.plugin) if self.gpu is not None else {}
        own = {k: str(v) for k, v in self.settings.conf.items()}
        s3 = spark_s3_conf(self.store, own, gpu_conf) if self.store is not None else {}
        conf = {**default_conf(self.master, self._driver or "127.0.0.1"), **gpu_conf, **s3, **own}
        listener = listener_classpath(self.lineage)  # with lineage: the OpenLineage listener's jar
        if listener:
            conf["spark.driver.extraClassPath"] = ":".join(filter(None, [conf.get("spark.driver.extraClassPath"),
                                                                          listener]))
        if self.settings.auth_secret:  # never in the conf of result_settings: a secret made per run
            conf.update(auth_conf(self.settings.auth_secret))
        conf.update(redaction_conf(conf, self.secrets))
        driver = "spark.driver.extraJavaOptions"  # before the pipeline's own: the JVM takes the last of a flag
        conf[driver] = f"{DRIVER_JIT} {conf.get(driver, '')}".strip()
        # No JVM perf-data file in /tmp (it copies the JVM's arguments, and a killed JVM leaves it).
        # Every exception keeps its message and stack: once an exception is hot, the JVM otherwise
        # throws a bare one, and a corrupt page would no longer be told from a bug in the stage.
        for role, options in (("driver", "-XX:-UsePerfData -XX:-OmitStackTraceInFastThrow"),
                              ("executor", "-XX:-OmitStackTraceInFastThrow")):
            key = f"spark.{role}.extraJavaOptions"
            conf[key] = f"{conf.get(key, '')} {options}".strip()
        return conf

    def start(self, code: Sequence[Path] = ()) -> None:
        if self.master.startswith("spark://"):
            host, port = split_host_port(self.master, 7077)
            self._driver = driver_address(host, port, self.settings.advertise_address)
            check_reachable("spark", self.master, host, port, source=self._driver)
        from pyspark.sql import SparkSession

        if SparkSession.getActiveSession() is not None:
            # getOrCreate would silently hand back that session, whatever master we ask for
            raise UnavailableError("a SparkSession is already running in this process",
                                   hint="stop it before running a pipeline with backend: spark")
        conf = self._session_conf()
        hidden = [*self.secrets, *filter(None, [self.settings.auth_secret])]
        secret = {k: v for k, v in conf.items() if any(value in v for value in hidden)}
        builder = SparkSession.builder.master(self.master)
        for key, value in conf.items():
            if key not in secret:  # pyspark puts these on the JVM's command line, which anyone can read
                builder = builder.config(key, value)
        # the JVM must not pick the host's address on its own: loopback, or the one that routes to the master
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        if self.master.startswith("local"):
            # Python workers run this interpreter (its venv, its pandas), not whatever python3 is on
            # PATH; a cluster's workers run their own (PYSPARK_PYTHON names it)
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        before = processes.children()
        try:
            with warnings.catch_warnings(), _submitted_privately(secret, self.log_dir), \
                    _local_ip(self._driver):
                warnings.simplefilter("ignore")  # pyspark's notice about pandas 3 on import
                self.session = builder.getOrCreate()
        except BaseException as exc:
            # a stop request (or a failure) half-way through: the JVM may be launched already, its
            # process known to no one yet; it must not outlive us
            self.stop()
            processes.end(processes.children() - before)
            if not isinstance(exc, Exception):
                raise
            raise UnavailableError(f"spark failed to start (master {self.master}): {first_line(exc)}",
                                   hint=f"see {self.log_dir / 'engines.log'}") from exc
        self.session.sparkContext.setLogLevel("ERROR")
        self._unroute = _route_query_context_logs()
        if self.gpu is not None:  # the plugin's NOT_ON_GPU explanations are warnings: keep them
            jvm = self.session.sparkContext._jvm
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
                "com.nvidia.spark.rapids", jvm.org.apache.logging.log4j.Level.WARN)
        for path in code:  # Python UDFs run in worker processes, which import the stage modules
            self.session.sparkContext.addPyFile(str(code_archive(path, self.log_dir)))

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
        if not self.master.startswith("spark://") or self.session is None:
            return
        versions = versions_probe()
        found = self._on_executors(lambda: (__import__("socket").gethostname(), versions(*VERSIONED)))
        require_same_versions("spark", self.master, dict(found), VERSIONED)

    def check_shared_workdir(self, workdir: Path) -> bool:
        if self._driver is None or self.session is None:
            return False
        def seen_by_executors(path: str) -> list[bool]:
            return self._on_executors(lambda: __import__("os").path.exists(path))

        require_shared_workdir("spark", self.master, workdir, seen_by_executors)
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

    # data checks (checkplan): one aggregate job over the written version

    def write_measured(self, frame: Any, directory: Path, partition_by: tuple[str, ...],  # noqa: PLR0913 - Backend's
                       target_file_size: int, plan) -> tuple[pa.Schema, dict[str, Any] | None]:
        # Every measure but distinct keys is observed by the write's own job (no second read). Distinct
        # keys must be compared across tasks, which an observation cannot (it refuses DISTINCT): they are
        # counted over the written files' key columns alone. Partitioned outputs are read back: their
        # partition values come from the paths.
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        if partition_by:
            return super().write_measured(frame, directory, partition_by, target_file_size, plan)
        aggregates = list(zip(plan.measures, plan.sql_aggregates("spark")))
        observation = Observation("hybridflow_checks")
        observed = frame.observe(observation, *[F.expr(e) for m, e in aggregates if m.op != "distinct"])
        schema = self.write(observed, directory, (), target_file_size)

        def measure() -> dict[str, Any]:
            values = observation.get
            distinct = [(m, e) for m, e in aggregates if m.op == "distinct"]
            if distinct:  # one job, reading the key columns only
                source = TableSource("checked", (directory,), "parquet", schema, (), directory,
                                     self.store if isinstance(directory, ObjectPath) else None)
                row = self.read(source).agg(*[F.expr(e) for _, e in distinct]).collect()[0]
                values |= {m.alias: row[m.alias] for m, _ in distinct}
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
            _check_representable(source.name, source.schema)
        elif source.format == "parquet":  # an external input without a declared schema: its footers say
            footers = read_footers(source.name, parquet_files(source), source.filesystem)
            _check_representable(source.name, footers.schema)
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
            writer = _coalesced(frame, target_file_size).write.mode("error")
        with self._conf({**_write_sizing(target_file_size), **(_OBJECT_STORE_WRITE if remote else {})}):
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
        if self.session is not None:
            self.session.sparkContext.cancelAllJobs()  # one stage at a time: all jobs are the stage's

    def stop(self) -> None:
        """Stop the session, and end the JVM: also one that a stop request caught half-started."""
        if "pyspark" not in sys.modules:
            return  # never started
        from pyspark import SparkContext

        if self.session is not None:
            event_logs = _event_logs(self.session.sparkContext) if self.secrets else None
            _end_accumulator_server_aside(self.session.sparkContext)
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
            if process is not None:
                process.kill()
                process.wait()
            SparkContext._gateway = None
            SparkContext._jvm = None
        if self._unroute is not None:
            self._unroute()
            self._unroute = None


# pyspark 4 logs the query context of a failed DataFrame or SQL operation (DIVIDE_BY_ZERO at a line
# of the stage) as a JSON record from this process, on a handler of its own bound to the stderr of
# the moment the logger was made: the terminal, when the write of the stage's output fails
QUERY_CONTEXT_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


def _route_query_context_logs():
    """Those loggers write to engines.log instead: to a copy of this process's stderr taken now,
    during the start, while it points there. Returns what undoes it."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # pyspark before 4 logs no such records
        return lambda: None
    sink = engine_output_stream()
    handler = logging.StreamHandler(sink)
    # PySparkLogger.getLogger swaps the class of new loggers process-wide for a moment: a logger an
    # engine starting beside this one made meanwhile would be a PySparkLogger too, printing JSON.
    # logging's own lock, which every getLogger takes, keeps the other threads out for that moment.
    with logging._lock:
        loggers = [PySparkLogger.getLogger(name) for name in QUERY_CONTEXT_LOGGERS]
    # pyspark's own handler (bound to the stderr of the moment); others that a caller put there stay
    saved = [[h for h in logger.handlers if type(h) is logging.StreamHandler] for logger in loggers]
    for logger, handlers in zip(loggers, saved):
        for old in handlers:
            logger.removeHandler(old)
        logger.addHandler(handler)  # PySparkLogger's addHandler gives it pyspark's JSON format
        logger.propagate = False

    def undo() -> None:
        for logger, handlers in zip(loggers, saved):
            logger.removeHandler(handler)
            for old in handlers:
                logger.addHandler(old)
        sink.close()

    return undo


def _end_accumulator_server_aside(context) -> None:
    """Shut pyspark's accumulator server down in a thread of its own, so that stopping the session
    does not wait for it: its loop polls every 0.5 s, and that wait was most of a Spark stop (0.5 s
    against 0.06 s for the JVM's own), on the run's critical path when Spark stops early."""
    server = getattr(context, "_accumulatorServer", None)  # private: where it is not, stop() does it all
    if server is None:
        return
    context._accumulatorServer = None  # SparkContext.stop() skips what it finds None
    # The JVM ends beside it: a worker's connection cut mid-read is expected then, and
    # socketserver would print its traceback to the terminal
    server.server_shutdown = True
    server.handle_error = lambda request, client_address: None
    threading.Thread(target=server.shutdown, daemon=True, name="hybridflow-spark-accumulators-stop").start()


def spark_progress(job: int, stages: int, done: int, total: int) -> str:
    """'job 3 · tasks 120/200', naming the number of stages when several run at once."""
    running = f" · {stages} stages" if stages > 1 else ""
    return f"job {max(job, 1)}{running} · tasks {done}/{total}"


# Adaptive execution sizes tasks by shuffle bytes (rows, lz4-compressed), which take about this many
# times the bytes of the same rows in snappy Parquet.
SHUFFLE_BYTES_PER_PARQUET_BYTE = 3


def _coalesced(frame, target_file_size: int):
    """The frame in at most as many tasks as files of the target size need, by the optimizer's size
    estimate (the bytes of the files a scan reads, an upper bound after filters and aggregations). A
    sorted output is left alone: its ordering shuffle is already sized by adaptive execution."""
    sorted_, estimate = _size_estimate(frame)
    if sorted_:
        return frame
    # a size Spark cannot estimate (a frame made from an RDD) is Long.MaxValue; coalesce takes a Java int
    return frame.coalesce(min(max(1, math.ceil(estimate / target_file_size)), 2**31 - 1))


def _size_estimate(frame) -> tuple[bool, int]:
    """(whether the optimized plan's top is a Sort, its size estimate in bytes): from the JVM's plan, or
    for a Spark Connect frame (no JVM here) from the server's explanation of it."""
    if hasattr(frame, "_jdf"):
        plan = frame._jdf.queryExecution().optimizedPlan()
        return plan.nodeName() == "Sort", int(str(plan.stats().sizeInBytes()))  # a Scala BigInt via py4j
    text = frame._explain_string(mode="cost").split("== Optimized Logical Plan ==", 1)[-1].strip()
    match = re.search(r"sizeInBytes=([\d.]+)\s*(B|KiB|MiB|GiB|TiB|PiB|EiB)?", text)
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50, "EiB": 2**60}
    estimate = int(float(match.group(1)) * units[match.group(2) or "B"]) if match else 0
    return text.startswith("Sort"), estimate


# Writing a version's prefix in object storage: each task's files are copied to their final keys once,
# when the task commits (v2), not twice (v1 copies again at job commit: S3 has no rename). A failed
# job can leave some tasks' files there: the prefix is no version until hybridflow's manifest says
# so, and its leftovers are removed with it. No _SUCCESS marker: hybridflow's commit is the marker.
_OBJECT_STORE_WRITE = {"mapreduce.fileoutputcommitter.algorithm.version": "2",
                       "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false"}


def _write_sizing(target_file_size: int) -> dict[str, str]:
    return {"spark.sql.adaptive.enabled": "true",
            "spark.sql.adaptive.coalescePartitions.enabled": "true",
            "spark.sql.adaptive.coalescePartitions.parallelismFirst": "false",  # honour the size, not the cores
            "spark.sql.adaptive.advisoryPartitionSizeInBytes": str(target_file_size * SHUFFLE_BYTES_PER_PARQUET_BYTE)}


@contextlib.contextmanager
def _local_ip(address: str | None):
    """SPARK_LOCAL_IP is `address` while the driver's JVM is launched (None: left as it is)."""
    if address is None:
        yield
        return
    with _environment("SPARK_LOCAL_IP", address):
        yield


@contextlib.contextmanager
def _environment(name: str, value: str):
    """This process's environment variable `name` is `value` while the block runs, then what it was."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def quoted(name: str) -> str:
    """`name` as a Spark column reference to exactly that column: Spark parses a string column as an
    expression (col.with.dot is field with.dot of col; a space, a bracket or a backtick is a syntax
    error), so it is backtick-quoted, backticks inside doubled."""
    return "`" + name.replace("`", "``") + "`"


def columns(names: Sequence[str]) -> list[str]:
    return [quoted(name) for name in names]


def _check_representable(dataset: str, schema: pa.Schema) -> None:
    """Refuse, naming the column, what Spark would misread instead of letting it corrupt data."""
    problems = unrepresentable(schema)
    if problems:
        raise DataError(f"dataset '{dataset}', {problems[0]}",
                        hint="cast or rename it in the stage (or the tool) that produces it")


def unrepresentable(schema: pa.Schema) -> list[str]:
    """What of a schema Spark cannot hold, a phrase per problem (validate warns with these too)."""
    import pyarrow as pa

    problems = [f"column '{f.name}': Spark has no {f.type} type" for f in schema
                if pa.types.is_unsigned_integer(f.type) or pa.types.is_float16(f.type)]
    clashes = case_collisions(schema.names)
    if clashes:
        problems.append(f"columns {', '.join(clashes)} differ only by case, which Spark cannot read")
    return problems


def create(settings, log_dir: Path) -> SparkBackend:
    if settings is not None and settings.remote:
        from .connect import SparkConnectBackend

        return SparkConnectBackend(settings, log_dir)
    return SparkBackend(settings, log_dir)
