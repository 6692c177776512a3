"""The Spark engine as the registry knows it: its settings (backends.spark in the pipeline file), the
stage `hybridflow init` writes for it, and its Engine declaration. Light to import (validate and
--help load it): the backend itself is imported when a run creates one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, model_validator

from ...settings import EngineSection, GpuMode, Params
from .. import Engine, GpuPlugin
from . import host
from .objectstorage import CONNECTORS, connector, fetch_connector
from .schemas import unrepresentable
from .standalone import cluster_launch

if TYPE_CHECKING:
    from .backend import SparkBackend


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
    stores=tuple(CONNECTORS),
    object_storage_check=lambda store: connector(store.scheme).check(),
    object_storage_fetch=lambda settings, store: fetch_connector(settings, store),
    cluster_launch=cluster_launch,
)


def create(settings, log_dir: Path) -> SparkBackend:
    """The session's backend, imported here: a run that creates one is the first to need it."""
    if settings is not None and settings.remote:
        from .connect import SparkConnectBackend

        return SparkConnectBackend(settings, log_dir)
    from .backend import SparkBackend

    return SparkBackend(settings, log_dir)
