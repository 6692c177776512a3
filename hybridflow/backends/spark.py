"""Spark: stages get pyspark.sql.DataFrames from a local or attached SparkSession.

Defaults close Spark's traps for a lossless hand-off : timestamps
written as TIMESTAMP_MICROS instead of INT96, the session time zone pinned to UTC, the UI off,
everything bound to 127.0.0.1, shuffle partitions sized to the machine, and engine logs sent to a
file instead of the terminal (the runner points the JVM's output at the run's engines.log).
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa

from ..errors import DataError, UnavailableError, first_line
from ..tables import TableSource
from .base import Backend, case_collisions, check_reachable, code_archive, split_host_port

def default_conf(master: str) -> dict[str, str]:
    cores = os.cpu_count() or 2
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
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


class SparkBackend(Backend):
    name = "spark"
    frame_types = "pyspark.sql.DataFrame"

    def __init__(self, settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.master = settings.master or "local[*]"
        self.session = None

    def start(self, code: Sequence[Path] = ()) -> None:
        if self.master.startswith("spark://"):
            host, port = split_host_port(self.master, 7077)
            check_reachable("spark", self.master, host, port)
        from pyspark.sql import SparkSession

        if SparkSession.getActiveSession() is not None:
            # getOrCreate would silently hand back that session, whatever master we ask for
            raise UnavailableError("a SparkSession is already running in this process",
                                   hint="stop it before running a pipeline with backend: spark")
        conf = {**default_conf(self.master), **{k: str(v) for k, v in self.settings.conf.items()}}
        builder = SparkSession.builder.master(self.master)
        for key, value in conf.items():
            builder = builder.config(key, value)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the JVM must not pick the host's address
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pyspark's notice about pandas 3 on import
                self.session = builder.getOrCreate()
        except Exception as exc:
            raise UnavailableError(f"spark failed to start (master {self.master}): {first_line(exc)}",
                                   hint=f"see {self.log_dir / 'engines.log'}") from exc
        self.session.sparkContext.setLogLevel("ERROR")
        for path in code:  # Python UDFs run in worker processes, which import the stage modules
            self.session.sparkContext.addPyFile(str(code_archive(path, self.log_dir)))

    def handles(self) -> dict[str, Any]:
        return {"spark": self.session}

    def is_frame(self, value: Any) -> bool:
        from pyspark.sql import DataFrame

        return isinstance(value, DataFrame)

    def read(self, source: TableSource):
        if source.schema is not None:
            _check_representable(source.name, source.schema)
        from pyspark.sql.pandas.types import from_arrow_schema

        reader = self.session.read
        paths = [str(f) for f in source.files]
        if source.partition_by:
            # an explicit schema makes Spark parse partition values as their recorded types
            reader = reader.option("basePath", str(source.base)).schema(from_arrow_schema(source.schema))
            return reader.parquet(*paths).select(*source.schema.names)
        if source.format == "parquet":
            return reader.parquet(*paths)
        if source.schema is not None:
            reader = reader.schema(from_arrow_schema(source.schema))
        if source.format == "csv":
            return reader.option("header", True).option("mode", "FAILFAST").csv(paths)
        return reader.option("mode", "FAILFAST").json(paths)

    def write_files(self, frame: Any, directory: Path, partition_by: tuple[str, ...]) -> pa.Schema:
        from pyspark.sql.pandas.types import to_arrow_schema

        clashes = case_collisions(frame.columns)
        if clashes:
            raise DataError(f"columns {', '.join(clashes)} differ only by case, which Spark cannot hold apart",
                            hint="rename one of them")
        # Spark insists on creating its output directory itself; it is inside our fresh staging area.
        target = directory / "_spark_output"
        writer = frame.write.mode("errorifexists")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.parquet(str(target))
        for entry in sorted(target.iterdir()):
            if entry.name.endswith(".parquet") or (entry.is_dir() and "=" in entry.name):
                entry.rename(directory / entry.name)
        shutil.rmtree(target)  # _SUCCESS: not data
        for checksum in directory.rglob(".*.crc"):
            checksum.unlink()
        return to_arrow_schema(frame.schema, timezone="UTC")

    def stop(self) -> None:
        if self.session is not None:
            from pyspark import SparkContext

            self.session.stop()
            self.session = None
            # spark.stop() leaves the py4j gateway JVM running until Python exits: end it now.
            gateway = SparkContext._gateway
            if gateway is not None:
                process = getattr(gateway, "proc", None)
                gateway.shutdown()
                if process is not None:
                    process.kill()
                    process.wait()
                SparkContext._gateway = None
                SparkContext._jvm = None


def _check_representable(dataset: str, schema: pa.Schema) -> None:
    """Refuse, naming the column, what Spark would misread instead of letting it corrupt data."""
    for field in schema:
        arrow_type = field.type
        if pa.types.is_unsigned_integer(arrow_type) or pa.types.is_float16(arrow_type):
            raise DataError(f"dataset '{dataset}', column '{field.name}': Spark has no {arrow_type} type",
                            hint="cast it to a signed or wider type in the stage that produces it")
    clashes = case_collisions(schema.names)
    if clashes:
        raise DataError(f"dataset '{dataset}': columns {', '.join(clashes)} differ only by case, which Spark "
                        "cannot read", hint="rename one of them in the stage that produces it")


def create(settings, log_dir: Path) -> SparkBackend:
    return SparkBackend(settings, log_dir)
