"""Spark's own OpenLineage events (column-level lineage of every query a stage runs) nested under
that stage's run, with the OpenLineage Spark listener (lineage_jar.py fetches it).

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

from ...definition.lineageids import LineageTarget, run_uuid
from ...errors import UnavailableError, first_line

log = logging.getLogger("hybridflow")

LISTENER = "io.openlineage.spark.agent.OpenLineageSparkListener"
DRAIN_GRACE_SECONDS = 2.0  # beyond the events' own timeout, waiting for the stage's last events to go out


def listener_conf(lineage: LineageTarget, run_id: str, stage: str) -> dict[str, str]:
    """The listener's spark.openlineage.* settings for one stage of the run `run_id`: the stage's run
    is its parent, the pipeline's run its root."""
    parent = {"JobNamespace": lineage.namespace, "JobName": f"{lineage.pipeline}.{stage}",
              "RunId": run_uuid(lineage.namespace, lineage.pipeline, run_id, stage)}
    root = {"JobNamespace": lineage.namespace, "JobName": lineage.pipeline,
            "RunId": run_uuid(lineage.namespace, lineage.pipeline, run_id)}
    conf = {
        "namespace": lineage.namespace,
        "appName": f"{lineage.pipeline}.{stage}.spark",  # Spark names its job pipeline_stage_spark
        **{f"parent{key}": value for key, value in parent.items()},
        **{f"rootParent{key}": value for key, value in root.items()},
        **{f"transport.{key}": value for key, value in lineage.transport.items()},
    }
    return {f"spark.openlineage.{key}": value for key, value in conf.items()}


def listener_classpath(lineage: LineageTarget | None) -> str | None:
    """The listener's jar, for the driver's classpath (fetched the first time); None without lineage
    or when it cannot be had, said in one warning: the run goes on without Spark's own lineage."""
    if lineage is None:
        return None
    from .lineage_jar import listener_jar

    try:
        return str(listener_jar())
    except UnavailableError as exc:
        log.warning("Spark's own lineage is off for this run: %s", exc.one_line())
        return None


@contextlib.contextmanager
def nested(session, lineage: LineageTarget | None, run_id: str, stage: str, stage_log):
    """Spark's events of the queries run inside the block nested under the stage's run."""
    # a Spark Connect session has no JVM here: its server's own listener is the server's business
    local = getattr(session, "_jsc", None) is not None
    listener = _listen(session, lineage, run_id, stage, stage_log) if lineage and local else None
    try:
        yield
    finally:
        if listener is not None:
            _stop_listening(session, listener, lineage.timeout + DRAIN_GRACE_SECONDS, stage_log)


def _listen(session, lineage: LineageTarget, run_id: str, stage: str, stage_log):
    """The stage's listener, told that its application started (it sends the application run's START,
    parent: the stage's run), then registered on the session's SparkContext."""
    try:
        spark = session.sparkContext
        context, jvm = spark._jsc.sc(), spark._jvm
        conf = context.conf().clone()  # the listener's own: the session's conf never holds the key
        for key, value in listener_conf(lineage, run_id, stage).items():
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
