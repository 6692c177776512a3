"""How Spark reaches object storage: through each store's Hadoop connector (s3a for S3, Google's GCS
connector for gs://), whose jars are fetched on first need unless the pipeline's own conf brings
them; paths as the connector names them; and the committer settings of a write straight into a
version's prefix."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Callable

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
    conf: Callable[[Any], dict[str, str]]  # the connector's settings for the store's settings


def _s3a_conf(store) -> dict[str, str]:
    """s3a's settings (s3:// is mapped to s3a too). Credentials come from s3a's default chain (the AWS
    variables, the profile, instance roles): never written into Spark's configuration, which its event
    log and UI show."""
    conf = {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            # hybridflow lists nothing through Spark and commits versions itself: no bucket probe
            "spark.hadoop.fs.s3a.bucket.probe": "0"}
    if store.endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = store.endpoint
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(not store.plain_http).lower()
    if store.region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = store.region
    if store.path_style is not None:
        conf["spark.hadoop.fs.s3a.path.style.access"] = str(store.path_style).lower()
    return conf


# the GCS connector reads these as plain numbers, which Hadoop 3.5's own defaults ("64m") are not
_GCS_SIZES = {"block.size": 64 << 20, "rewrite.max.chunk.size": 512 << 20, "outputstream.buffer.size": 8 << 20,
              "inputstream.inplace.seek.limit": 8 << 20, "inputstream.min.range.request.size": 2 << 20}


def _gcs_conf(store) -> dict[str, str]:
    """Google's GCS connector's settings. Credentials come from Google's standard places (application
    default credentials), never written into Spark's configuration, which its event log and UI show;
    an emulator is reached without any."""
    conf = {"spark.hadoop.fs.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
            "spark.hadoop.fs.AbstractFileSystem.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS",
            "spark.hadoop.fs.gs.auth.type": "UNAUTHENTICATED" if store.endpoint else "APPLICATION_DEFAULT",
            **{f"spark.hadoop.fs.gs.{key}": str(size) for key, size in _GCS_SIZES.items()},
            # the connector's vectored reads call a Hadoop 3.4 method that Hadoop 3.5 no longer has
            "spark.hadoop.parquet.hadoop.vectored.io.enabled": "false"}
    if store.endpoint:
        # emulators lack the objects.move call: a task's files are committed by copy and delete
        conf |= {"spark.hadoop.fs.gs.storage.root.url": store.endpoint,
                 "spark.hadoop.fs.gs.operation.move.enable": "false"}
    if store.project:
        conf["spark.hadoop.fs.gs.project.id"] = store.project
    return conf


# az:// has none here: Spark reaches it through copies on this machine (Engine.way_to)
CONNECTORS = {"s3": Connector("s3a", "hadoop-aws", lambda: s3_jars_fetcher().s3_jars(),
                              lambda: s3_jars_fetcher().check(), _s3a_conf),
              "gs": Connector("gs", "gcs-connector", lambda: [_gcs_jar().connector_jar()], lambda: _gcs_jar().check(),
                              _gcs_conf)}


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
    pipeline's own conf brings it), and the connector's settings for that store (credentials: the
    connector reads the cloud's own variables and files)."""
    conf = connector(store.scheme).conf(store)
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
