"""`hybridflow check`: the declared checks against what is published now and against external
inputs, without running a stage; and what a failed check looks like at the end of a run (exit 65,
one line naming dataset, check, failing rows and examples; the stages after it not run)."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.store.catalog import Catalog

STAGES = '''
def same(events):
    return events
'''

PIPELINE = '''
name: checked
datasets:
  events:
    path: raw/events
    checks:
      - not_null: [id]
      - row_count: {min: 2}
  weeks:
    checks:
      - unique: [id]
      - row_count_change: {max_drop: 0.5}
stages:
  copy: {run: "mypkg.steps:same", inputs: [events], outputs: [weeks]}
'''


@pytest.fixture
def checked(project):
    project.stages(STAGES)
    project.pipeline(PIPELINE)
    return project


def deliver(project, ids: list) -> None:
    folder = project.root / "raw" / "events"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), folder / "part-0.parquet")


def cli(project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], cwd=project.root, capture_output=True,
                          text=True, timeout=120)


def test_check_passes_on_what_is_published_and_fails_on_a_bad_delivery(checked):
    deliver(checked, [1, 2, 3, 4])
    assert cli(checked, "run", "pipeline.yaml").returncode == 0
    passed = cli(checked, "check", "pipeline.yaml")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "4 checks, 0 failed" in passed.stdout

    deliver(checked, [1, None])
    failed = cli(checked, "check", "pipeline.yaml", "events")
    assert failed.returncode == 65, failed.stdout + failed.stderr
    assert "dataset 'events': check 'not_null_id' (not_null) failed: 1 of 2 rows fail" in failed.stdout
    assert "2 checks, 1 failed" in failed.stdout


def test_check_names_an_unknown_dataset_with_a_suggestion(checked):
    deliver(checked, [1, 2])
    done = cli(checked, "check", "pipeline.yaml", "week")
    assert done.returncode == 2 and "no dataset named 'week' (did you mean 'weeks'?)" in done.stdout + done.stderr


def test_a_truncated_delivery_stops_the_run_and_keeps_the_published_version(checked):
    deliver(checked, list(range(10)))
    assert cli(checked, "run", "pipeline.yaml").returncode == 0
    catalog = Catalog(checked.root / ".hybridflow" / "checked")
    before = catalog.current("weeks").id
    deliver(checked, [1, 2, 3])
    done = cli(checked, "run", "pipeline.yaml")
    assert done.returncode == 65, done.stdout + done.stderr
    assert "dataset 'weeks': check 'row_count_change' (row_count_change) failed: 3 rows against 10 published" \
        in done.stdout + done.stderr
    assert catalog.current("weeks").id == before


def test_a_bad_external_input_stops_the_stage_before_it_starts(checked):
    deliver(checked, [1, 2, 3])
    assert cli(checked, "run", "pipeline.yaml").returncode == 0
    catalog = Catalog(checked.root / ".hybridflow" / "checked")
    before = catalog.current("weeks").id
    deliver(checked, [None, 5, 6])
    checked.stages(STAGES.replace("return events", "open('called', 'w').close()\n    return events"))
    done = cli(checked, "run", "pipeline.yaml")
    assert done.returncode == 65, done.stdout + done.stderr
    assert "dataset 'events': check 'not_null_id' (not_null) failed: 1 of 3 rows fail" in done.stdout + done.stderr
    assert not (checked.root / "called").exists()  # the stage's function never started
    assert catalog.current("weeks").id == before


def test_notify_lists_the_failed_and_warned_checks(project):
    import json

    project.stages(STAGES)
    project.pipeline(f'''
    name: notified
    datasets:
      events: {{path: raw/events}}
      weeks:
        checks:
          - row_count: {{min: 100}}
            on_fail: warn
          - unique: [id]
    stages:
      copy: {{run: "mypkg.steps:same", inputs: [events], outputs: [weeks]}}
    notify:
      on: [failure, success]
      command: ["{sys.executable}", "-c", "import sys; open('summary.json', 'w').write(sys.stdin.read())"]
    ''')
    deliver(project, [1, 1, 2])
    assert cli(project, "run", "pipeline.yaml").returncode == 65
    checks = json.loads((project.root / "summary.json").read_text())["checks"]
    assert [(c["dataset"], c["check"], c["status"], c["failing"]) for c in checks] == [
        ("weeks", "row_count", "warned", None), ("weeks", "unique_id", "failed", 1)]


def test_show_and_the_report_have_a_checks_table_with_the_previous_run_beside(checked):
    deliver(checked, list(range(10)))
    assert cli(checked, "run", "pipeline.yaml").returncode == 0
    deliver(checked, list(range(6)))
    assert cli(checked, "run", "pipeline.yaml").returncode == 0
    shown = subprocess.run([sys.executable, "-m", "hybridflow.cli", "show", "last"], cwd=checked.root, text=True,
                           capture_output=True, timeout=120, env={**__import__("os").environ, "COLUMNS": "250"})
    assert "data checks" in shown.stdout and "row_count_change" in shown.stdout
    assert "6 (0.60x)" in shown.stdout, shown.stdout
    report = cli(checked, "report", "last")
    html = open(report.stdout.strip()).read()
    assert "<h2>Data checks</h2>" in html and "6 (0.60x)" in html
    # the row count of the input measured now, beside the previous run's
    assert "<td>row_count</td><td class='passed'>passed</td><td class='num'></td><td class='num'>6</td>" \
           "<td class='num'>10</td>" in html
    assert "<td>weeks</td><td>unique_id</td><td class='passed'>passed</td>" in html


def test_check_of_every_dataset_checks_the_published_ones_when_a_failed_first_run_left_one_unpublished(checked):
    deliver(checked, [1, 1, 2])  # a duplicate id: the first run's check of weeks fails, nothing is published
    assert cli(checked, "run", "pipeline.yaml").returncode == 65
    everything = cli(checked, "check", "pipeline.yaml")
    assert everything.returncode == 0, everything.stdout + everything.stderr
    assert "dataset 'events': check 'row_count' passed" in everything.stdout  # the external input is still checked
    assert "dataset 'weeks' has no published version yet, so it was not checked" in everything.stderr
    named = cli(checked, "check", "pipeline.yaml", "weeks")  # asked for by name: there is nothing to check
    assert named.returncode == 2 and "dataset 'weeks' has no published version yet" in named.stderr, named.stderr
