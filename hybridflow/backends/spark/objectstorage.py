"""How Spark reaches object storage: through each store's Hadoop connector (s3a for S3, Google's GCS
connector for gs://), whose jars are fetched on first need unless the pipeline's own conf brings
them; paths as the connector names them; and the committer settings of a write straight into a
version's prefix."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Callable

from ...data.storage import ObjectPath
from ...errors import UnavailableError


def s3_jars_fetcher():
    """The s3a jars' fetcher, imported when a run reaches object storage: it brings http, ssl and xml
    (10 ms), which every other command (validate, a local run) loads the Spark engine's declaration without."""
    from . import s3_jars

    return s3_jars


def _gcs_jar():
    from . import gcs_jar

    return gcs_jar


@dataclass(frozen=True)
class Connector:
    """How Spark reaches a store: through a Hadoop connector."""

    scheme: str  # how the connector names the store's paths
    name: str  # in a pipeline's own conf: it brings the connector itself
    jars: Callable[[], list[Path]]  # the connector's jars, fetched here the first time
    check: Callable[[], str]  # for doctor: where its jars are, or that their repository answers


CONNECTORS = {"s3": Connector("s3a", "hadoop-aws", lambda: s3_jars_fetcher().s3_jars(),
                              lambda: s3_jars_fetcher().check()),
              "gs": Connector("gs", "gcs-connector", lambda: [_gcs_jar().connector_jar()], lambda: _gcs_jar().check())}


def connector(scheme: str) -> Connector:
    """The connector of the store whose URIs have `scheme`; UnavailableError for a store Spark cannot reach."""
    if scheme not in CONNECTORS:
        raise UnavailableError(f"Spark has no connector for {scheme}:// paths",
                               hint="run Spark on this machine (it reaches the store through local copies), or the "
                                    "stage on another engine")
    return CONNECTORS[scheme]


def spark_path(path: PurePath) -> str:
    """A file as Spark names it: in its store's connector's scheme (s3a://bucket/key for S3), else the path."""
    return f"{connector(path.scheme).scheme}://{path}" if isinstance(path, ObjectPath) else str(path)


def _brings_connector(own: dict[str, str], store) -> bool:
    """The pipeline's own conf brings the store's connector: hybridflow adds none."""
    name = connector(store.scheme).name
    return any(name in own.get(key, "") for key in ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath"))


def fetch_connector(settings, store) -> None:
    """Before a run whose driver will need the store's connector: fetched now, once per machine (a
    Spark Connect server reaches object storage with its own)."""
    if settings.remote or _brings_connector({k: str(v) for k, v in settings.conf.items()}, store):
        return
    connector(store.scheme).jars()


def spark_store_conf(store, own: dict[str, str], gpu_conf: dict[str, str]) -> dict[str, str]:
    """What Spark needs to read the store's paths: its Hadoop connector on the classpath (unless the
    pipeline's own conf brings it), and the settings every engine is given for that store
    (credentials: the connector reads the cloud's own variables and files)."""
    conf = store.spark_conf()
    if _brings_connector(own, store):
        return conf
    jars = [str(jar) for jar in connector(store.scheme).jars()]  # fetched here the first time
    # on the classpath where they lie (on a cluster, every worker has them under the same path: the
    # connector's fetch command run there): spark.jars would copy s3a's 700 MB to each executor
    for key in ("spark.driver.extraClassPath", "spark.executor.extraClassPath"):
        conf[key] = ":".join([*filter(None, [gpu_conf.get(key)]), *jars])
    return conf


# Writing a version's prefix in object storage: each task's files are copied to their final keys once,
# when the task commits (v2), not twice (v1 copies again at job commit: S3 has no rename). A failed
# job can leave some tasks' files there: the prefix is no version until hybridflow's manifest says
# so, and its leftovers are removed with it. No _SUCCESS marker: hybridflow's commit is the marker.
OBJECT_STORE_WRITE = {"mapreduce.fileoutputcommitter.algorithm.version": "2",
                       "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false"}
