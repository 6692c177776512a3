"""`lineage:` with Spark stages, end to end on a real Spark with the real OpenLineage Spark listener
(fetched from Maven Central into ~/.cache/hybridflow/jars on first need): Spark's own events of each
stage's queries arrive where hybridflow's go, nested under that stage's run, with column-level
lineage for a join: each stage's Spark application run is a child of the stage's run, and each of
its queries a child of that; the API key reaches the listener and nothing else. Offline, the run goes on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.openlineage import LineageReceiver, validate

KEY = "ol-spark-key-7c2e91"  # what ${env:OL_KEY} expands to

STAGES = '''
import os


def _no_command_line_holds(key):
    """No process's command line (the Spark JVM's among them) holds the API key."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if key.encode() in cmdline.read():
                    raise RuntimeError(f"process {pid} has the API key on its command line")
        except OSError:
            pass


def make(ctx):
    spark = ctx.spark
    customers = spark.range(1, 3).selectExpr("id AS customer_id", "concat('c', id) AS name", "'uk' AS country")
    orders = spark.range(10, 13).selectExpr("id AS order_id", "id % 2 + 1 AS customer_id", "id * 0.5 AS amount")
    return {"customers": customers.select("customer_id", "name", "country"), "orders": orders}


def enrich(ctx, customers, orders):
    _no_command_line_holds(os.environ["OL_KEY"])
    joined = orders.join(customers, "customer_id")
    return joined.select("order_id", "name", (joined.amount * 100).alias("cents"))
'''

PIPELINE = """
name: shop
stages:
  make: {{run: "mypkg.steps:make", backend: spark, outputs: [customers, orders]}}
  enrich: {{run: "mypkg.steps:enrich", backend: spark, inputs: [customers, orders], outputs: [enriched]}}
backends:
  spark: {{master: "local[1]"}}
lineage:
{lineage}
"""


@pytest.fixture
def receiver():
    server = LineageReceiver()
    yield server
    server.close()


def run(project, lineage: str, **env) -> subprocess.CompletedProcess:
    project.stages(STAGES)
    path = project.pipeline(PIPELINE.format(lineage=lineage))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OPENLINEAGE")}
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", str(path)], cwd=project.root,
                          env={**environ, "OL_KEY": KEY, **env}, capture_output=True, text=True, timeout=600)


def is_spark(event: dict) -> bool:
    return "spark" in event["producer"].lower() or "openlineage-spark" in event["producer"]


def dataset_of(path: str) -> str:
    """Which of the stage's inputs a path Spark read is in (<workdir>/<dataset>/versions/...)."""
    parts = Path(path).parts
    return parts[parts.index("versions") - 1]


def stage_runs(events: list[dict]) -> dict[str, str]:
    """hybridflow's stage runs: job name -> run id."""
    return {e["job"]["name"]: e["run"]["runId"] for e in events if not is_spark(e) and e["job"]["name"] != "shop"}


def test_spark_events_nest_under_each_stage_run_with_column_lineage(project, receiver):
    done = run(project, f"  url: {receiver.url}\n  api_key: ${{env:OL_KEY}}\n  namespace: team")
    assert done.returncode == 0, done.stderr
    ours = [e for e in receiver.events if not is_spark(e)]
    spark = [e for e in receiver.events if is_spark(e)]
    for event in ours:
        validate(event)
    runs = stage_runs(ours)
    [pipeline_run] = {e["run"]["runId"] for e in ours if e["job"]["name"] == "shop"}
    assert set(runs) == {"shop.make", "shop.enrich"}

    # each stage's Spark application run is the child of that stage's run (the listener's parent)
    applications = {e["run"]["facets"]["parent"]["job"]["name"]: e for e in spark
                    if e["eventType"] == "START" and "." not in e["job"]["name"]}
    assert set(applications) == {"shop.make", "shop.enrich"}
    for stage, application in applications.items():
        parent = application["run"]["facets"]["parent"]
        assert parent["job"]["namespace"] == "team" and parent["run"]["runId"] == runs[stage]
        assert parent["root"] == {"job": {"namespace": "team", "name": "shop"}, "run": {"runId": pipeline_run}}
        assert application["job"]["name"] == stage.replace(".", "_") + "_spark"
    assert len({a["run"]["runId"] for a in applications.values()}) == 2
    ended = {e["run"]["runId"] for e in spark if e["eventType"] == "COMPLETE" and "." not in e["job"]["name"]}
    assert ended == {a["run"]["runId"] for a in applications.values()}

    # and each query the stage ran is a child of its stage's application run, rooted in the pipeline run
    by_stage: dict[str, list[dict]] = {}
    for event in spark:
        parent = event["run"]["facets"]["parent"]
        assert parent["root"]["run"]["runId"] == pipeline_run and parent["root"]["job"]["name"] == "shop"
        if "." in event["job"]["name"]:
            [stage] = [s for s, a in applications.items() if a["run"]["runId"] == parent["run"]["runId"]]
            assert parent["job"]["name"] == applications[stage]["job"]["name"]
            by_stage.setdefault(stage, []).append(event)
    assert set(by_stage) == {"shop.make", "shop.enrich"}

    # the join's write: each output column traced to the input columns it came from
    written = [o for e in by_stage["shop.enrich"] if e["eventType"] == "COMPLETE" for o in e.get("outputs", [])
               if "columnLineage" in o.get("facets", {})]
    assert written, [e["job"]["name"] for e in by_stage["shop.enrich"]]
    fields = written[-1]["facets"]["columnLineage"]["fields"]
    sources = {column: {(dataset_of(f["name"]), f["field"]) for f in fields[column]["inputFields"]}
               for column in ("order_id", "name", "cents")}
    assert sources == {"order_id": {("orders", "order_id")}, "name": {("customers", "name")},
                       "cents": {("orders", "amount")}}

    assert all(headers["Authorization"] == f"Bearer {KEY}" for _, headers in receiver.requests)
    assert KEY not in done.stdout + done.stderr + json.dumps(receiver.events)
    for file in (project.root / ".hybridflow").rglob("*"):
        assert not file.is_file() or KEY.encode() not in file.read_bytes(), file


def test_without_the_listener_jar_the_run_goes_on_with_one_warning(project, receiver, tmp_path):
    with socket.socket() as free:  # a Maven repository nothing listens on
        free.bind(("127.0.0.1", 0))
        offline = f"http://127.0.0.1:{free.getsockname()[1]}/maven2/"
    done = run(project, f"  url: {receiver.url}", HYBRIDFLOW_JARS=str(tmp_path / "jars"),
               HYBRIDFLOW_MAVEN_REPOSITORY=offline)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in (done.stdout + done.stderr).splitlines() if "Spark's own lineage is off" in line]
    assert len(warnings) == 1 and "cannot fetch the OpenLineage Spark listener" in warnings[0], done.stderr
    assert not [e for e in receiver.events if is_spark(e)]
    assert set(stage_runs(receiver.events)) == {"shop.make", "shop.enrich"}  # hybridflow's own still go out


def test_with_a_file_transport_spark_appends_its_events_to_the_same_file(project):
    done = run(project, "  transport: file\n  path: lineage/events.jsonl")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in (project.root / "lineage" / "events.jsonl").read_text().splitlines()]
    runs = stage_runs(events)
    parents = {e["run"]["facets"]["parent"]["run"]["runId"] for e in events
               if is_spark(e) and "." not in e["job"]["name"]}
    assert set(runs) == {"shop.make", "shop.enrich"} and parents == set(runs.values())
