"""How Spark reaches object storage: paths as s3a names them, the s3a connector's jars (fetched on
first need, unless the pipeline's own conf brings them) and conf, and the committer settings of a
write straight into a version's prefix."""

from __future__ import annotations

from pathlib import PurePath

from ...data.storage import ObjectPath


def spark_path(path: PurePath) -> str:
    """A file as Spark names it: s3a://bucket/key for an object (hadoop-aws's scheme), else the path."""
    return f"s3a://{path}" if isinstance(path, ObjectPath) else str(path)


def _names_hadoop_aws(own: dict[str, str]) -> bool:
    """The pipeline's own conf brings the s3a connector: hybridflow adds none."""
    return any("hadoop-aws" in own.get(key, "") for key in ("spark.jars", "spark.jars.packages",
                                                             "spark.driver.extraClassPath"))


def s3_jars_fetcher():
    """The s3a jars' fetcher, imported when a run reaches object storage: it brings http, ssl and xml
    (10 ms), which every other command (validate, a local run) loads the Spark engine's declaration without."""
    from . import s3_jars

    return s3_jars


def fetch_s3_jars(settings) -> None:
    """Before a run whose driver will need the s3a jars: fetched now, once per machine (a Spark Connect
    server reaches object storage with its own)."""
    if settings.remote or _names_hadoop_aws({k: str(v) for k, v in settings.conf.items()}):
        return
    s3_jars_fetcher().s3_jars()


def spark_s3_conf(store, own: dict[str, str], gpu_conf: dict[str, str]) -> dict[str, str]:
    """What Spark needs to read s3:// paths: hadoop-aws and the AWS SDK on its classpath (unless the
    pipeline's own conf brings them), and the endpoint, region and addressing every engine is given
    (credentials: s3a's default chain reads the AWS variables and profile)."""
    conf = store.spark_conf()
    if _names_hadoop_aws(own):
        return conf
    jars = [str(jar) for jar in s3_jars_fetcher().s3_jars()]  # fetched here the first time
    # on the classpath where they lie (on a cluster, every worker has them under the same path: `python
    # -m hybridflow.backends.spark_s3_jars` there): spark.jars would copy 700 MB to each executor
    for key in ("spark.driver.extraClassPath", "spark.executor.extraClassPath"):
        conf[key] = ":".join([*filter(None, [gpu_conf.get(key)]), *jars])
    return conf


# Writing a version's prefix in object storage: each task's files are copied to their final keys once,
# when the task commits (v2), not twice (v1 copies again at job commit: S3 has no rename). A failed
# job can leave some tasks' files there: the prefix is no version until hybridflow's manifest says
# so, and its leftovers are removed with it. No _SUCCESS marker: hybridflow's commit is the marker.
OBJECT_STORE_WRITE = {"mapreduce.fileoutputcommitter.algorithm.version": "2",
                       "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false"}
