"""`lineage:` end to end: the real CLI in a subprocess sends OpenLineage events to an endpoint on
127.0.0.1 (or a JSON-lines file), each one checked against the specification's JSON schemas."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone

import pytest

from hybridflow.errors import ExitCode
from hybridflow.store.catalog import Catalog
from tests.support.openlineage import LineageReceiver, validate
from tests.unit.test_runner import STAGES

KEY = "ol-key-5d1e9a7c"  # what ${env:OL_KEY} expands to: sent as the Bearer token, never shown

PIPELINE = """
name: demo
datasets:
  artifact: {{kind: files}}
stages:
  make: {{run: 'mypkg.steps:make', outputs: [numbers, meta]}}
  double: {{run: 'mypkg.steps:double', inputs: [numbers], outputs: [doubled, artifact], params: {{factor: 2}}}}
  {extra}
lineage:
{lineage}
"""

FAILING = "bad: {run: 'mypkg.steps:boom', inputs: [numbers], outputs: [y]}"


@pytest.fixture
def receiver():
    server = LineageReceiver()
    yield server
    server.close()


def hybridflow(project, *args, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OPENLINEAGE")}
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *map(str, args)], cwd=project.root,
                          env={**environ, "OL_KEY": KEY, **env}, capture_output=True, text=True, timeout=300)


def write(project, lineage: str, extra: str = "") -> object:
    project.stages(STAGES)
    return project.pipeline(PIPELINE.format(extra=extra, lineage=lineage))


def by_job(events: list[dict]) -> dict[str, list[str]]:
    jobs: dict[str, list[str]] = {}
    for event in events:
        jobs.setdefault(event["job"]["name"], []).append(event["eventType"])
    return jobs


def test_a_run_and_its_stages_are_told_with_their_datasets_versions_and_schemas(project, receiver):
    path = write(project, f"  url: {receiver.url}\n  api_key: ${{env:OL_KEY}}\n  namespace: team-ml")
    done = hybridflow(project, "run", path)
    assert done.returncode == 0, done.stderr
    events = receiver.events
    for event in events:
        validate(event)
    assert by_job(events) == {"demo": ["START", "COMPLETE"], "demo.make": ["START", "COMPLETE"],
                              "demo.double": ["START", "COMPLETE"]}
    assert all(p == "/api/v1/lineage" and h["Authorization"] == f"Bearer {KEY}" for p, h in receiver.requests)
    assert {e["job"]["namespace"] for e in events} == {"team-ml"}
    assert KEY not in done.stdout + done.stderr

    parent = events[0]
    run_id = next(t["value"] for t in parent["run"]["facets"]["tags"]["tags"] if t["key"] == "hybridflow.run_id")
    assert str(uuid.UUID(parent["run"]["runId"])) == parent["run"]["runId"]
    stage_runs = {e["run"]["runId"] for e in events if e["job"]["name"] != "demo"}
    assert len(stage_runs) == 2 and parent["run"]["runId"] not in stage_runs
    for event in events[1:-1]:
        facet = event["run"]["facets"]["parent"]
        assert facet["run"]["runId"] == parent["run"]["runId"]
        assert (facet["job"]["namespace"], facet["job"]["name"]) == ("team-ml", "demo")
        location = event["job"]["facets"]["sourceCodeLocation"]
        assert location["url"] == (project.root / "mypkg" / "steps.py").resolve().as_uri()

    catalog = Catalog(project.home("demo"))
    [double_end] = [e for e in events if e["job"]["name"] == "demo.double" and e["eventType"] == "COMPLETE"]
    [numbers] = double_end["inputs"]
    published = catalog.current("numbers")
    assert (numbers["namespace"], numbers["name"]) == ("file", str(published.directory.parent.parent))
    assert numbers["facets"]["version"]["datasetVersion"] == published.id
    assert [(f["name"], f["type"]) for f in numbers["facets"]["schema"]["fields"]] == \
        [(f.name, str(f.type)) for f in published.schema]
    outputs = {o["name"].rpartition("/")[2]: o for o in double_end["outputs"]}
    doubled = catalog.current("doubled")
    assert outputs["doubled"]["outputFacets"]["outputStatistics"] == {
        **outputs["doubled"]["outputFacets"]["outputStatistics"], "rowCount": 3, "size": doubled.bytes}
    assert outputs["doubled"]["facets"]["version"]["datasetVersion"] == doubled.id
    assert outputs["artifact"]["facets"]["version"]["datasetVersion"] == catalog.current("artifact").id
    assert "schema" not in outputs["artifact"]["facets"]  # a files output has no table schema
    assert (project.home("demo") / "runs" / run_id).is_dir()


def test_skipped_stages_emit_nothing_and_the_run_lists_the_versions_they_hold(project, receiver):
    path = write(project, f"  url: {receiver.url}")
    assert hybridflow(project, "run", path).returncode == 0
    first = len(receiver.events)
    done = hybridflow(project, "run", path)  # nothing changed: every stage skips
    assert done.returncode == 0, done.stderr
    events = receiver.events[first:]
    for event in events:
        validate(event)
    assert by_job(events) == {"demo": ["START", "COMPLETE"]}
    catalog = Catalog(project.home("demo"))
    held = {o["name"].rpartition("/")[2]: o["facets"]["version"]["datasetVersion"] for o in events[-1]["outputs"]}
    assert held == {ds: catalog.current(ds).id for ds in ("numbers", "meta", "doubled", "artifact")}


def test_a_failed_stage_and_run_end_with_fail_and_the_error(project, receiver):
    path = write(project, f"  url: {receiver.url}", extra=FAILING)
    done = hybridflow(project, "run", path)
    assert done.returncode == ExitCode.STAGE_FAILED, done.stderr
    for event in receiver.events:
        validate(event)
    jobs = by_job(receiver.events)
    assert jobs["demo.bad"] == ["START", "FAIL"] and jobs["demo"] == ["START", "FAIL"]
    [bad_end] = [e for e in receiver.events if e["job"]["name"] == "demo.bad" and e["eventType"] == "FAIL"]
    error = bad_end["run"]["facets"]["errorMessage"]
    assert error["message"].startswith("ValueError: the data is bad: 3") and error["programmingLanguage"] == "PYTHON"
    assert bad_end["outputs"] == []


def test_an_unreachable_endpoint_is_one_warning_after_the_summary(project):
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}/${{env:OL_KEY}}"
    path = write(project, f"  url: {url}\n  api_key: ${{env:OL_KEY}}\n  timeout: 2")
    done = hybridflow(project, "run", path)
    assert done.returncode == 0, done.stderr  # the run's outcome, not the tracker's
    warnings = [line for line in done.stderr.splitlines() if "OpenLineage" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ") and "6 OpenLineage events not delivered" \
        in warnings[0], done.stderr
    assert done.stderr.splitlines()[-1] == warnings[0]
    assert KEY not in done.stdout + done.stderr


def test_events_go_to_a_json_lines_file(project):
    path = write(project, "  transport: file\n  path: lineage/events.jsonl")
    assert hybridflow(project, "run", path).returncode == 0
    events = [json.loads(line) for line in (project.root / "lineage" / "events.jsonl").read_text().splitlines()]
    for event in events:
        validate(event)
    assert by_job(events)["demo.make"] == ["START", "COMPLETE"]


def test_the_standard_environment_turns_lineage_on_without_a_lineage_section(project, receiver):
    project.stages(STAGES)
    path = project.pipeline("""
        name: demo
        stages:
          make: {run: 'mypkg.steps:make', outputs: [numbers, meta]}
        """)
    done = hybridflow(project, "run", path, OPENLINEAGE_URL=receiver.url, OPENLINEAGE_NAMESPACE="from-env")
    assert done.returncode == 0, done.stderr
    for event in receiver.events:
        validate(event)
    assert by_job(receiver.events) == {"demo": ["START", "COMPLETE"], "demo.make": ["START", "COMPLETE"]}
    assert {e["job"]["namespace"] for e in receiver.events} == {"from-env"}


SLOW = '''
import time


def slow(numbers):
    print("slow stage started", flush=True)
    time.sleep(3600)
'''


def test_an_interrupted_run_and_its_running_stage_end_with_abort(project, receiver):
    project.stages(STAGES)
    project.write("mypkg/slowsteps.py", SLOW)
    path = project.pipeline(PIPELINE.format(extra="slow: {run: 'mypkg.slowsteps:slow', inputs: [numbers], "
                                                  "outputs: [never]}", lineage=f"  url: {receiver.url}"))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OPENLINEAGE")}
    run = subprocess.Popen([sys.executable, "-m", "hybridflow.cli", "run", str(path), "--only", "make",
                            "--only", "slow"], cwd=project.root, env=environ,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while ("demo.slow", "START") not in [(e["job"]["name"], e["eventType"]) for e in receiver.events]:
            assert run.poll() is None and time.monotonic() < deadline, "the slow stage's START never came"
            time.sleep(0.1)
        run.send_signal(signal.SIGINT)
        assert run.wait(180) == 130
    finally:
        if run.poll() is None:
            run.kill()
    for event in receiver.events:
        validate(event)
    jobs = by_job(receiver.events)
    assert jobs["demo.slow"] == ["START", "ABORT"] and jobs["demo"] == ["START", "ABORT"]


def test_a_scheduled_run_carries_its_nominal_time(project, receiver):
    from croniter import croniter

    path = write(project, f"  url: {receiver.url}")
    path.write_text(path.read_text() + "schedule: {cron: '*/5 * * * *', timezone: Europe/Paris}\n")
    before = datetime.now(timezone.utc)
    done = hybridflow(project, "run", path, "--trigger", "cron")
    assert done.returncode == 0, done.stderr
    for event in receiver.events:
        validate(event)
    nominal = {e["run"]["facets"]["nominalTime"]["nominalStartTime"] for e in receiver.events}
    assert len(nominal) == 1  # the pipeline's run and every stage's: the time the schedule ran it for
    moment = datetime.fromisoformat(nominal.pop().replace("Z", "+00:00"))
    latest = croniter("*/5 * * * *", before).get_prev(datetime)
    assert latest <= moment <= datetime.now(timezone.utc) and moment.minute % 5 == 0 and moment.second == 0


def test_the_rows_a_check_dropped_are_an_output_in_the_workdir_with_its_version(project):
    """`<dataset>_rejected` (the rows a drop check removed) is a published dataset of the stage, never
    the project folder an undeclared external input would resolve to."""
    project.stages(STAGES)
    path = project.pipeline("""
        name: demo
        datasets:
          numbers:
            checks:
              - range: {column: id, max: 1}
                on_fail: drop
        stages:
          make: {run: 'mypkg.steps:make', outputs: [numbers, meta]}
        lineage: {transport: file, path: lineage/events.jsonl}
        """)
    done = hybridflow(project, "run", path)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in (project.root / "lineage" / "events.jsonl").read_text().splitlines()]
    for event in events:
        validate(event)
    [ended] = [e for e in events if e["job"]["name"] == "demo.make" and e["eventType"] == "COMPLETE"]
    rejected = {o["name"]: o for o in ended["outputs"]}
    [name] = [n for n in rejected if n.endswith("numbers_rejected")]
    assert "/datasets/numbers_rejected" in name and rejected[name]["facets"]["version"]["datasetVersion"]


CHECKED = """
name: demo
datasets:
  events:
    path: raw/events
    checks:
      - not_null: [user]
      - row_count: {{min: {events_min}}}
  numbers:
    checks:
      - not_null: [id]
      - range: {{column: value, max: 2.0}}
        on_fail: {on_fail}
      - unique: [id]
stages:
  make: {{run: 'mypkg.steps:make', outputs: [numbers, meta]}}
  seen: {{run: 'mypkg.steps:use', inputs: [events], outputs: [seen]}}
lineage: {{transport: file, path: lineage/events.jsonl}}
"""


def checked_run(project, events_min: int = 1, on_fail: str = "warn", options: tuple = ()):
    import pyarrow as pa
    import pyarrow.parquet as pq

    project.stages(STAGES)
    (project.root / "raw" / "events").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"user": ["a", "b"]}), project.root / "raw" / "events" / "part-0.parquet")
    path = project.pipeline(CHECKED.format(events_min=events_min, on_fail=on_fail))
    done = hybridflow(project, "run", path, *options)
    events = [json.loads(line) for line in (project.root / "lineage" / "events.jsonl").read_text().splitlines()]
    for event in events:
        validate(event)  # the data-quality facets against their vendored schemas, too
    return done, events


def ended(events: list[dict], job: str) -> dict:
    [event] = [e for e in events if e["job"]["name"] == job and e["eventType"] in ("COMPLETE", "FAIL")]
    return event


def assertions(dataset: dict) -> dict[str, dict]:
    return {a["name"]: a for a in dataset["facets"]["dataQualityAssertions"]["assertions"]}


def test_the_checks_of_outputs_and_external_inputs_are_data_quality_facets(project):
    done, events = checked_run(project)
    assert done.returncode == 0, done.stderr
    [numbers] = [o for o in ended(events, "demo.make")["outputs"] if o["name"].endswith("/numbers")]
    found = assertions(numbers)
    assert {name: (a["assertion"], a["success"], a.get("column"), a["severity"]) for name, a in found.items()} == {
        "not_null_id": ("not_null", True, "id", "error"), "range_value": ("range", False, "value", "warn"),
        "unique_id": ("unique", True, "id", "error")}  # value 3.0 of 0, 1.5, 3.0 is out of range: warned
    assert found["range_value"]["params"] == {"on_fail": "warn", "status": "warned", "failing": 1,
                                              "detail": "1 of 3 rows fail"}
    metrics = numbers["facets"]["dataQualityMetrics"]
    assert (metrics["rowCount"], {c: m["nullCount"] for c, m in metrics["columnMetrics"].items()}) == (3, {"id": 0})
    assert "dataQualityAssertions" not in {k for o in ended(events, "demo.make")["outputs"]
                                           if o["name"].endswith("/meta") for k in o["facets"]}  # declares none

    [source] = ended(events, "demo.seen")["inputs"]
    assert (source["namespace"], source["name"].rpartition("/")[0][-4:]) == ("file", "/raw")
    assert {n: a["success"] for n, a in assertions(source).items()} == {"not_null_user": True, "row_count": True}
    metrics = source["facets"]["dataQualityMetrics"]  # the rows a row_count check counted
    assert (metrics["rowCount"], {c: m["nullCount"] for c, m in metrics["columnMetrics"].items()}) == (2, {"user": 0})
    # the pipeline's final event lists each output at its version with the checks that version passed
    [held] = [o for o in events[-1]["outputs"] if o["name"].endswith("/numbers")]
    assert assertions(held) == found


def test_a_failed_check_is_the_failed_assertion_of_the_stage_fail_event(project):
    done, events = checked_run(project, events_min=5, on_fail="error", options=("--keep-going",))
    assert done.returncode == ExitCode.DATA, done.stderr
    make = ended(events, "demo.make")
    assert make["eventType"] == "FAIL" and "range_value" in make["run"]["facets"]["errorMessage"]["message"]
    [numbers] = make["outputs"]  # the output the check kept from being published: a place, no version
    assert numbers["name"].endswith("/numbers") and "version" not in numbers["facets"]
    assert {n: a["success"] for n, a in assertions(numbers).items()} == {
        "not_null_id": True, "range_value": False, "unique_id": True}
    assert assertions(numbers)["range_value"]["severity"] == "error"

    seen = ended(events, "demo.seen")  # an external input's failed check fails the stage that reads it
    assert seen["eventType"] == "FAIL" and seen["outputs"] == []
    [source] = seen["inputs"]
    failed = assertions(source)["row_count"]
    assert (failed["success"], failed["actual"], failed["params"]["status"]) == (False, "2", "failed")
