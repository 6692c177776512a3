"""Spark's own OpenLineage events (column-level lineage of every query a stage runs) nested under
that stage's run, with the OpenLineage Spark listener (spark_lineage_jar.py fetches it).

The listener reads its configuration once, when it is made: its parent cannot change afterwards,
and Spark's job-local properties do not reach it. A session shared by several stages therefore gets
one listener per stage, made with that stage's run as its parent (spark.openlineage.parentJobName:
pipeline.stage, parentRunId: the stage's run id; the root: the pipeline's run) when the stage's try
begins, and removed when it ends, once Spark's listener bus has handed it every event of the
stage's queries. Registered after Spark's application started, it is told that start (and later its
end) directly, so each stage has a Spark application run of its own, job `pipeline_stage_spark` (the
listener's spelling), child of the stage's run, and every query of the stage is a child of that.

Events go where hybridflow's go: the same http URL, endpoint and API key (set on the listener's own
copy of the session conf inside the JVM, never on a command line or in the session's conf), or the
same file. Lineage never fails a run: a listener that cannot be fetched or made is one warning, and
the stage runs without Spark's own lineage."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import UnavailableError, first_line
from ..spec.lineageids import namespace_of, run_uuid

log = logging.getLogger("hybridflow")

LISTENER = "io.openlineage.spark.agent.OpenLineageSparkListener"
DRAIN_GRACE_SECONDS = 2.0  # beyond the events' own timeout, waiting for the stage's last events to go out


@dataclass(frozen=True)
class SparkLineage:
    """Where a pipeline's events go and under which names: what a Spark session needs to nest its own."""

    pipeline: str
    namespace: str
    transport: dict[str, str]  # spark.openlineage.transport.* (an API key among them: a secret)
    timeout: float

    @classmethod
    def of(cls, pipeline) -> SparkLineage | None:
        """For a pipeline with `lineage:`; None without (the OpenLineage environment alone configures
        hybridflow's events, not Spark's)."""
        spec = pipeline.spec.lineage
        if spec is None:
            return None
        if spec.transport == "file":
            path = Path(spec.path)
            transport = {"type": "file", "location": str(path if path.is_absolute() else pipeline.root / path)}
        else:
            transport = {"type": "http", "url": spec.url, "endpoint": "/" + spec.endpoint.lstrip("/"),
                         "timeoutInMillis": str(int(spec.timeout * 1000))}
            if spec.api_key:
                transport.update({"auth.type": "api_key", "auth.apiKey": spec.api_key})
        return cls(pipeline.name, namespace_of(pipeline), transport, spec.timeout)

    def listener_conf(self, run_id: str, stage: str) -> dict[str, str]:
        """The listener's spark.openlineage.* settings for one stage of the run `run_id`: the stage's run
        is its parent, the pipeline's run its root."""
        parent = {"JobNamespace": self.namespace, "JobName": f"{self.pipeline}.{stage}",
                  "RunId": run_uuid(self.namespace, self.pipeline, run_id, stage)}
        root = {"JobNamespace": self.namespace, "JobName": self.pipeline,
                "RunId": run_uuid(self.namespace, self.pipeline, run_id)}
        conf = {
            "namespace": self.namespace,
            "appName": f"{self.pipeline}.{stage}.spark",  # Spark names its job pipeline_stage_spark
            **{f"parent{key}": value for key, value in parent.items()},
            **{f"rootParent{key}": value for key, value in root.items()},
            **{f"transport.{key}": value for key, value in self.transport.items()},
        }
        return {f"spark.openlineage.{key}": value for key, value in conf.items()}


def listener_classpath(lineage: SparkLineage | None) -> str | None:
    """The listener's jar, for the driver's classpath (fetched the first time); None without lineage
    or when it cannot be had, said in one warning: the run goes on without Spark's own lineage."""
    if lineage is None:
        return None
    from .spark_lineage_jar import listener_jar

    try:
        return str(listener_jar())
    except UnavailableError as exc:
        log.warning("Spark's own lineage is off for this run: %s", exc.one_line())
        return None


@contextlib.contextmanager
def nested(session, lineage: SparkLineage | None, run_id: str, stage: str, stage_log):
    """Spark's events of the queries run inside the block nested under the stage's run."""
    # a Spark Connect session has no JVM here: its server's own listener is the server's business
    local = getattr(session, "_jsc", None) is not None
    listener = _listen(session, lineage, run_id, stage, stage_log) if lineage and local else None
    try:
        yield
    finally:
        if listener is not None:
            _stop_listening(session, listener, lineage.timeout + DRAIN_GRACE_SECONDS, stage_log)


def _listen(session, lineage: SparkLineage, run_id: str, stage: str, stage_log):
    """The stage's listener, told that its application started (it sends the application run's START,
    parent: the stage's run), then registered on the session's SparkContext."""
    try:
        spark = session.sparkContext
        context, jvm = spark._jsc.sc(), spark._jvm
        conf = context.conf().clone()  # the listener's own: the session's conf never holds the key
        for key, value in lineage.listener_conf(run_id, stage).items():
            conf.set(key, value)
        listener = _jvm_class(jvm, LISTENER)(conf)
        nothing = jvm.scala.Option.empty()
        listener.onApplicationStart(jvm.org.apache.spark.scheduler.SparkListenerApplicationStart(
            f"{lineage.pipeline}.{stage}", jvm.scala.Option.apply(spark.applicationId), _now(), spark.sparkUser(),
            nothing, nothing, nothing))
        context.addSparkListener(listener)
    except Exception as exc:  # noqa: BLE001 - the listener is not on the classpath (it could not be fetched)
        stage_log.warning("Spark's own lineage is off for this stage: %s", first_line(exc))
        return None
    return listener


def _stop_listening(session, listener, seconds: float, stage_log) -> None:
    """Remove the stage's listener once Spark's bus has handed it what the stage's queries posted (it
    sends each event as it gets it), waiting at most `seconds`; then its application run ends."""
    spark = session.sparkContext
    context, jvm = spark._jsc.sc(), spark._jvm
    try:
        context.listenerBus().waitUntilEmpty(int(seconds * 1000))
    except Exception as exc:  # noqa: BLE001 - a bus that did not drain in time: the rest of the events are lost
        stage_log.warning("Spark's own lineage: not every event went out in %.0f s (%s)", seconds, first_line(exc))
    with contextlib.suppress(Exception):
        context.removeSparkListener(listener)
        listener.onApplicationEnd(jvm.org.apache.spark.scheduler.SparkListenerApplicationEnd(
            _now(), jvm.scala.Option.empty()))
        listener.close()  # its client's connections


def _jvm_class(jvm, name: str):
    holder = jvm
    for part in name.split("."):
        holder = getattr(holder, part)
    return holder


def _now() -> int:
    return int(time.time() * 1000)
