"""What validate says of the `checks:` declared on datasets: each problem at its file:line:col,
with a did-you-mean where a name is close."""

from __future__ import annotations

from pathlib import Path

from hybridflow.definition.config import load_pipeline
from hybridflow.definition.datachecks import dataset_checks
from tests.support.projects import errors_of

STAGE = "def make(events):\n    return events\n\ndef no_future(frame):\n    return 0\n"


def pipeline_with_checks(project, checks: str) -> Path:
    project.write("stages/weekly.py", STAGE)
    project.write("data/events/part.csv", "customer_id,events\n1,2\n")
    return project.pipeline(f"""
        name: checked
        root: .
        datasets:
          events: {{path: data/events, format: csv}}
          weeks:
            schema: {{customer_id: int64, events: int64, plan: string}}
            checks:
{checks}
        stages:
          make:
            backend: python
            run: stages.weekly:make
            inputs: [events]
            outputs: [weeks]
    """)


def indented(*lines: str) -> str:
    return "\n".join("              " + line for line in lines)


def test_every_kind_of_the_issue_is_read_with_its_outcome(project):
    path = pipeline_with_checks(project, indented(
        "- not_null: [customer_id, events]",
        "- unique: [customer_id]",
        "- range: {column: events, min: 0, max: 100000}",
        "- accepted_values: {column: plan, values: [free, pro, team]}",
        "- row_count: {min: 1000}",
        "- row_count_change: {max_drop: 0.5, max_growth: 3.0}",
        "- null_fraction: {column: plan, max: 0.2}",
        "- expr: \"events BETWEEN 0 AND 127\"",
        "  on_fail: drop",
        "  name: events_bitmask",
        "- python: stages.weekly:no_future",
        "  on_fail: warn",
        "- freshness: {column: events, max_age: 8d}",
    ))
    assert errors_of(path) == []
    checks = dataset_checks(load_pipeline(path), "weeks")
    assert [(c.kind, c.name, c.on_fail) for c in checks] == [
        ("not_null", "not_null_customer_id_events", "error"), ("unique", "unique_customer_id", "error"),
        ("range", "range_events", "error"), ("accepted_values", "accepted_values_plan", "error"),
        ("row_count", "row_count", "error"), ("row_count_change", "row_count_change", "error"),
        ("null_fraction", "null_fraction_plan", "error"), ("expr", "events_bitmask", "drop"),
        ("python", "python_no_future", "warn"), ("freshness", "freshness_events", "error")]


def test_an_unknown_kind_is_named_at_its_key_with_a_suggestion(project):
    [error] = errors_of(pipeline_with_checks(project, indented("- not_nul: [customer_id]")))
    assert ":8:9: error: dataset 'weeks': unknown check kind 'not_nul' (did you mean 'not_null'?)" in error


def test_a_column_not_in_the_declared_schema_is_named_with_a_suggestion(project):
    [error] = errors_of(pipeline_with_checks(project, indented("- range: {column: event, min: 0}")))
    assert ":8:" in error and "check 'range_event': column 'event' is not in the declared schema " \
                               "(did you mean 'events'?)" in error


def test_an_expr_column_not_in_the_schema_is_named(project):
    [error] = errors_of(pipeline_with_checks(project, indented("- expr: \"evnts >= 0\"")))
    assert "column 'evnts' is not in the declared schema (did you mean 'events'?)" in error


def test_drop_on_an_aggregate_check_is_refused_at_on_fail(project):
    [error] = errors_of(pipeline_with_checks(project, indented("- unique: [customer_id]", "  on_fail: drop")))
    assert ":9:" in error and "on_fail: drop needs a row-level check" in error and "'unique' judges" in error


def test_a_misspelt_on_fail_is_suggested(project):
    [error] = errors_of(pipeline_with_checks(project, indented("- row_count: {min: 1}", "  on_fail: wran")))
    assert "on_fail must be one of error, warn, drop, not 'wran' (did you mean 'warn'?)" in error


def test_an_expr_that_does_not_parse_is_refused(project):
    [error] = errors_of(pipeline_with_checks(project, indented("- expr: \"events >= (0 AND\"")))
    assert ":8:" in error and "expr does not parse as SQL" in error


def test_a_query_is_not_an_expr(project):
    [error] = errors_of(pipeline_with_checks(project, indented("- expr: \"SELECT 1\"")))
    assert "expr must be a boolean expression over one row" in error


def test_a_missing_python_check_function_is_named_with_a_suggestion(project):
    [error] = errors_of(pipeline_with_checks(project, indented("- python: stages.weekly:no_futur")))
    assert "module 'stages.weekly' has no function 'no_futur' (did you mean 'no_future'?)" in error


def test_a_misspelt_key_of_a_kind_is_suggested(project):
    errors = errors_of(pipeline_with_checks(project, indented("- row_count: {minimum: 1}")))
    assert any("row_count has no key 'minimum'" in e for e in errors)


def test_bad_bounds_and_durations_are_refused(project):
    errors = errors_of(pipeline_with_checks(project, indented(
        "- row_count_change: {max_drop: 1.5}", "- freshness: {column: events, max_age: soon}",
        "- null_fraction: {column: plan, max: 2}")))
    assert len(errors) == 3
    assert "max_drop is a fraction between 0 and 1" in errors[0]
    assert "freshness.max_age: 'soon' is not a duration" in errors[1]
    assert "null_fraction.max is a fraction between 0 and 1" in errors[2]


def test_a_null_among_accepted_values_is_refused_at_its_line(project):
    path = pipeline_with_checks(project, indented("- accepted_values: {column: plan, values: [free, null]}"))
    [error] = errors_of(path)
    assert error.startswith(f"{path}:8:49: error: dataset 'weeks'")  # the check's line, at its values
    assert "accepted_values.values cannot hold null" in error and "add not_null to refuse it" in error


def test_drop_is_refused_on_an_external_input_and_checks_on_a_files_dataset(project):
    project.write("stages/weekly.py", STAGE)
    project.write("data/events/part.csv", "customer_id,events\n1,2\n")
    errors = errors_of(project.pipeline("""
        name: checked
        root: .
        datasets:
          events:
            path: data/events
            format: csv
            checks:
              - expr: "events >= 0"
                on_fail: drop
          model:
            kind: files
            checks:
              - row_count: {min: 1}
        stages:
          make: {backend: python, run: "stages.weekly:make", inputs: [events], outputs: [model]}
    """))
    assert any(":9:" in e and "drop removes rows from what a stage writes, not from an external input" in e
               for e in errors), errors
    assert any("dataset 'model' is kind: files: checks judge the rows of a table" in e for e in errors), errors
