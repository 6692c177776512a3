"""The Spark engine as the registry knows it: its settings (backends.spark in the pipeline file), the
stage `hybridflow init` writes for it, and its Engine declaration; beside it, what is done around
Spark without starting it: Java and the RAPIDS jar on this machine (host), each store's Hadoop
connector and its jars (objectstorage, s3_jars, gcs_jar, jarcache), a standalone cluster's
commands (standalone). Light to import (validate and --help load it): the backend,
hybridflow.backends.spark, is imported when a run creates one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, model_validator

from ...data.contract import case_collisions
from ...settings import EngineSection, GpuMode, Params
from .. import Engine, GpuPlugin
from . import host
from .objectstorage import CONNECTORS, connector, fetch_connector
from .standalone import cluster_launch

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


@dataclass(frozen=True)
class SparkMaster:
    """Where a session's executors run, from `master:`, told apart here only: in the driver's own JVM
    (local[N], the default); on a standalone cluster's master (spark://host:port, which hybridflow
    checks is reachable, routes the driver's address to and checks the workers' versions of); or on
    another cluster manager (yarn, k8s://...), which Spark reaches on its own."""

    url: str

    @classmethod
    def of(cls, settings: SparkSettings) -> SparkMaster:
        return cls(settings.master or "local[*]")

    @property
    def local(self) -> bool:
        return self.url.startswith("local")

    @property
    def standalone(self) -> bool:
        return self.url.startswith("spark://")

    def __str__(self) -> str:
        return self.url


def _attached(settings: SparkSettings) -> bool:
    return bool(settings.remote) or not SparkMaster.of(settings).local


# the stage `hybridflow init` writes for this engine ({input}: the dataset it reads)
EXAMPLE_STAGE = '''"""Column work on Spark: a Spark DataFrame in and out (a `ctx` parameter would give the session)."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def in_cents({input}: DataFrame) -> DataFrame:
    return {input}.withColumn("amount_cents", F.round(F.col("amount") * 100).cast("long"))
'''



def unrepresentable(schema: pa.Schema) -> list[str]:
    """What of a schema Spark cannot hold, a phrase per problem (validate warns with these too)."""
    import pyarrow as pa

    problems = [f"column '{f.name}': Spark has no {f.type} type" for f in schema
                if pa.types.is_unsigned_integer(f.type) or pa.types.is_float16(f.type)]
    clashes = case_collisions(schema.names)
    if clashes:
        problems.append(f"columns {', '.join(clashes)} differ only by case, which Spark cannot read")
    return problems


ENGINE = Engine(
    name="spark", module="hybridflow.backends.spark", example=(EXAMPLE_STAGE, "in_cents"),
    settings=SparkSettings, description="Spark: a local session or a cluster's master",
    frame_types="pyspark.sql.DataFrame", requires=("pyspark",), extra="spark", distributions=("pyspark",),
    doctor=host.doctor_checks, environment=("JAVA_HOME",),
    gpu=True, gpu_plugin=GpuPlugin("Spark RAPIDS jar", "the RAPIDS Accelerator jar for Spark",
                                   host.find_rapids_jar, host.JAR_HINT),
    attached=_attached, sql_dialect="spark",
    result_settings=lambda settings: {"spark_conf": dict(settings.conf)},
    unrepresentable=unrepresentable,
    stores=tuple(CONNECTORS),
    object_storage_check=lambda store: connector(store.scheme).check(),
    object_storage_fetch=lambda settings, store: fetch_connector(settings, store),
    cluster_launch=cluster_launch,
    # parquet-mr and Spark's readers
    undecodable=(r"ParquetDecodingException", r"can not read value at \d+ in block", r"FAILED_READ_FILE",
                 r"Error reading parquet", r"Malformed levels", r"Page was smaller than"),
    unparsable=(r"MALFORMED_RECORD_IN_PARSING", r"Malformed records are detected"),
    decoder_frames=(r"org\.apache\.parquet\.column\.",
                    r"org\.apache\.spark\.sql\.execution\.datasources\.parquet\.(?:Vectorized|ParquetDictionary)"),
)
