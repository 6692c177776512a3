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
from hybridflow.definition.config import load_pipeline
from hybridflow.errors import ExitCode
from hybridflow.execution.runner import Runner
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


# --- partitioned and incremental outputs: checked per partition ---

def week(plans: list[str], first_id: int = 1) -> pa.Table:
    return pa.table({"id": list(range(first_id, first_id + len(plans))), "plan": plans})


def deliver_week(project: Project, name: str, value: str, table: pa.Table) -> None:
    folder = project.root / "raw" / name / f"delivery_week={value}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-0.parquet")


def partitioned(project: Project, name: str, incremental: bool) -> str:
    return str(project.pipeline(f'''
    name: {name}
    root: .
    datasets:
      events: {{path: raw/{name}, partition_by: [delivery_week],
               schema: {{delivery_week: string, id: int64, plan: string}}}}
      weeks:
        partition_by: [delivery_week]
        checks:
          - accepted_values: {{column: plan, values: [free, pro, team]}}
          - row_count: {{min: 1}}
          - row_count_change: {{max_drop: 0.5, max_growth: 3.0}}
    stages:
      copy: {{run: "mypkg.steps:same", backend: {engine_of(name)}, incremental: {str(incremental).lower()},
             inputs: [events], outputs: [weeks]}}
    ''', f"{name}.yaml"))


def by_partition(records: list[dict]) -> dict[tuple, tuple]:
    return {(r.get("partition"), r["check"]): (r["status"], r["failing"]) for r in records}


@pytest.mark.parametrize("name", ENGINES)
def test_a_partitioned_output_is_checked_per_partition_and_the_error_names_it(engines, project, name):
    run = f"parts-{name}"
    for value in ("2026-11-09", "2026-11-16"):
        deliver_week(project, run, value, week(["free", "pro", "team"]))
    deliver_week(project, run, "2026-11-23", week(["free", "gold", "gold", "pro"]))
    result = Runner(load_pipeline(partitioned(project, run, incremental=False)), engines=engines).run()
    assert result.status == "failed" and result.error.exit_code == ExitCode.DATA
    assert ("dataset 'weeks', partition delivery_week=2026-11-23: check 'accepted_values_plan' (accepted_values) "
            "failed: 2 of 4 rows fail") in result.stages["copy"].error
    recorded = by_partition(result.stages["copy"].checks["weeks"])
    assert recorded[("delivery_week=2026-11-23", "accepted_values_plan")] == ("failed", 2)
    assert recorded[("delivery_week=2026-11-09", "accepted_values_plan")] == ("passed", 0)
    assert {p for p, _ in recorded} == {"delivery_week=2026-11-09", "delivery_week=2026-11-16",
                                        "delivery_week=2026-11-23"}
    assert Catalog(project.home(run)).current("weeks") is None


@pytest.mark.parametrize("name", ENGINES)
def test_a_truncated_incremental_partition_fails_on_row_count_change_and_names_it(engines, project, name):
    run = f"inc-{name}"
    path = partitioned(project, run, incremental=True)
    for value, plans in (("2026-11-09", ["free"] * 4), ("2026-11-16", ["pro"] * 6), ("2026-11-23", ["team"] * 8)):
        deliver_week(project, run, value, week(plans))
    first = Runner(load_pipeline(path), engines=engines).run()
    assert first.status == "success", first.error
    catalog = Catalog(project.home(run))
    published = catalog.current("weeks")
    assert published.manifest["partition_rows"] == {"delivery_week=2026-11-09": 4, "delivery_week=2026-11-16": 6,
                                                    "delivery_week=2026-11-23": 8}
    kept = [r for r in published.manifest["checks"] if r["partition"] == "delivery_week=2026-11-09"]
    assert [r["status"] for r in kept] == ["passed"] * 3

    deliver_week(project, run, "2026-11-16", week(["pro"] * 2))  # a truncated redelivery: 2 of its 6 rows
    deliver_week(project, run, "2026-11-30", week(["free"] * 7))  # a new week, about as big as the others
    result = Runner(load_pipeline(path), engines=engines).run()
    assert result.status == "failed" and result.error.exit_code == ExitCode.DATA
    assert ("dataset 'weeks', partition delivery_week=2026-11-16: check 'row_count_change' (row_count_change) "
            "failed: 2 rows against 6 published in delivery_week=2026-11-16 (0.33x") in result.stages["copy"].error
    recorded = by_partition(result.stages["copy"].checks["weeks"])
    assert {p for p, _ in recorded} == {"delivery_week=2026-11-16", "delivery_week=2026-11-30"}  # only these ran
    assert recorded[("delivery_week=2026-11-30", "row_count_change")] == ("passed", None)
    assert catalog.current("weeks").id == published.id

    deliver_week(project, run, "2026-11-16", week(["pro"] * 5))  # the full redelivery
    fixed = Runner(load_pipeline(path), engines=engines).run()
    assert fixed.status == "success", fixed.error
    manifest = catalog.current("weeks").manifest
    assert [r for r in manifest["checks"] if r["partition"] == "delivery_week=2026-11-09"] == kept  # carried over
    new = {r["check"]: r for r in manifest["checks"] if r["partition"] == "delivery_week=2026-11-30"}
    assert new["row_count_change"]["value"] == {"rows": 7, "previous": 6, "ratio": round(7 / 6, 4)}  # the median
    assert "median published partition" in new["row_count_change"]["detail"]
    assert {r["partition"] for r in fixed.stages["copy"].checks["weeks"]} == {"delivery_week=2026-11-16",
                                                                             "delivery_week=2026-11-30"}
    assert manifest["partition_rows"]["delivery_week=2026-11-16"] == 5
