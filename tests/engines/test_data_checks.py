"""Data checks on every engine, over outputs with planted bad rows: an error-level check publishes
nothing of the stage and leaves the previous version current, warn publishes and records, drop
publishes exactly the good rows and quarantines exactly the bad ones with the check's name. Each
engine runs the checks itself (one aggregate pass) over the version it just wrote."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.data.tables import read_arrow
from hybridflow.errors import ExitCode
from hybridflow.execution.runner import Runner
from hybridflow.spec.config import load_pipeline
from hybridflow.store.catalog import Catalog
from tests.support.engines import ENGINES, start_engines
from tests.support.projects import Project

STAGES = '''
def same(events):
    return events


def later(weeks):
    return weeks
'''

GOOD = pa.table({"id": [1, 2, 3, 4], "plan": ["free", "pro", "team", "pro"], "events": [5, 0, 7, 100]})
# id 12 has an unknown plan, id 13 negative events, id 14 both: drop labels it with the first check
BAD = pa.table({"id": [1, 2, 3, 4, 12, 13, 14], "plan": ["free", "pro", "team", "pro", "gold", "free", "gold"],
                "events": [5, 0, 7, 100, 3, -1, -9]})


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("checks"))
    project.stages(STAGES)
    return project


@pytest.fixture(scope="module")
def started(tmp_path_factory, project):
    """Each engine started once for the module, when a test first needs it (a -k selection starts one)."""
    running: dict = {}
    try:
        yield running
    finally:
        for engine in running.values():
            engine.stop()


@pytest.fixture
def engines(started, tmp_path_factory, project, name):
    for engine in {"python", name} - set(started):
        started.update(start_engines(tmp_path_factory.mktemp("engine-logs"), [engine], code=[project.root / "mypkg"]))
    return {engine: started[engine] for engine in {"python", name}}


def deliver(project: Project, name: str, table: pa.Table) -> None:
    folder = project.root / "raw" / name
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-0.parquet")


def pipeline(project: Project, name: str, on_fail: str):
    return project.pipeline(f'''
    name: {name}
    root: .
    datasets:
      events: {{path: raw/{name}}}
      weeks:
        checks:
          - not_null: [id]
          - accepted_values: {{column: plan, values: [free, pro, team]}}
            on_fail: {on_fail}
          - expr: "events >= 0"
            name: no_negative_events
            on_fail: {on_fail}
          - unique: [id]
          - row_count: {{min: 1}}
    stages:
      copy: {{run: "mypkg.steps:same", backend: {engine_of(name)}, inputs: [events], outputs: [weeks]}}
      after: {{run: "mypkg.steps:later", backend: python, inputs: [weeks], outputs: [later]}}
    ''', f"{name}.yaml")


def engine_of(name: str) -> str:
    return name.split("-")[-1]


def ids(catalog: Catalog, dataset: str) -> list:
    return sorted(read_arrow(catalog.current(dataset).source()).column("id").to_pylist())


@pytest.mark.parametrize("name", ENGINES)
def test_an_error_level_check_publishes_nothing_and_the_previous_version_stays(engines, project, name):
    run = f"error-{name}"
    deliver(project, run, GOOD)
    path = pipeline(project, run, "error")
    first = Runner(load_pipeline(path), engines=engines).run()
    assert first.status == "success", first.error
    catalog = Catalog(project.home(run))
    before = catalog.current("weeks").id, catalog.current("later").id
    assert [c["status"] for c in catalog.current("weeks").manifest["checks"]] == ["passed"] * 5

    deliver(project, run, BAD)
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "failed" and result.error.exit_code == ExitCode.DATA
    message = result.stages["copy"].error
    assert "dataset 'weeks': check 'accepted_values_plan' (accepted_values) failed: 2 of 7 rows fail" in message
    assert "plan='gold'" in message and "and 1 more failed check" in message
    assert result.stages["after"].status == "not run"
    assert (catalog.current("weeks").id, catalog.current("later").id) == before
    assert ids(catalog, "weeks") == [1, 2, 3, 4]
    recorded = {c["check"]: c for c in result.stages["copy"].checks["weeks"]}
    assert recorded["no_negative_events"]["status"] == "failed" and recorded["no_negative_events"]["failing"] == 2
    assert recorded["unique_id"]["status"] == "passed"


@pytest.mark.parametrize("name", ENGINES)
def test_a_warn_level_check_publishes_and_records(engines, project, name):
    run = f"warn-{name}"
    deliver(project, run, BAD)
    result = Runner(load_pipeline(pipeline(project, run, "warn")), engines=engines).run()
    assert result.status == "success", result.error
    catalog = Catalog(project.home(run))
    assert ids(catalog, "weeks") == [1, 2, 3, 4, 12, 13, 14]
    recorded = {c["check"]: (c["status"], c["failing"]) for c in catalog.current("weeks").manifest["checks"]}
    assert recorded == {"not_null_id": ("passed", 0), "accepted_values_plan": ("warned", 2),
                        "no_negative_events": ("warned", 2), "unique_id": ("passed", 0), "row_count": ("passed", None)}
    assert {c["check"]: c["status"] for c in result.stages["copy"].checks["weeks"]}["no_negative_events"] == "warned"
    assert catalog.current("weeks_rejected") is None  # only drop quarantines


@pytest.mark.parametrize("name", ENGINES)
def test_a_drop_level_check_publishes_the_good_rows_and_quarantines_the_bad(engines, project, name):
    run = f"drop-{name}"
    deliver(project, run, BAD)
    result = Runner(load_pipeline(pipeline(project, run, "drop")), engines=engines).run()
    assert result.status == "success", result.error
    catalog = Catalog(project.home(run))
    assert ids(catalog, "weeks") == [1, 2, 3, 4]
    assert ids(catalog, "later") == [1, 2, 3, 4]
    rejected = read_arrow(catalog.current("weeks_rejected").source())
    assert sorted(zip(rejected.column("id").to_pylist(), rejected.column("check").to_pylist())) == [
        (12, "accepted_values_plan"), (13, "no_negative_events"), (14, "accepted_values_plan")]
    assert sorted(rejected.column_names) == ["check", "events", "id", "plan"]
    recorded = {c["check"]: (c["status"], c["failing"]) for c in catalog.current("weeks").manifest["checks"]}
    assert recorded["accepted_values_plan"] == ("dropped", 2) and recorded["no_negative_events"] == ("dropped", 2)
    assert recorded["row_count"] == ("passed", None)
    assert catalog.current("weeks").manifest["checks"] == catalog.current("weeks_rejected").manifest["checks"]
    assert json.dumps(result.stages["copy"].checks)  # recorded as JSON in the run records


@pytest.mark.parametrize("name", ENGINES)
def test_nothing_to_drop_still_publishes_an_empty_quarantine(engines, project, name):
    run = f"clean-{name}"
    deliver(project, run, GOOD)
    result = Runner(load_pipeline(pipeline(project, run, "drop")), engines=engines).run()
    assert result.status == "success", result.error
    catalog = Catalog(project.home(run))
    assert ids(catalog, "weeks") == [1, 2, 3, 4]
    assert catalog.current("weeks_rejected").rows == 0
