"""A dataset's data checks as OpenLineage's data-quality facets: each check's outcome an assertion
(`dataQualityAssertions`), and what the checks counted of the whole dataset (`dataQualityMetrics`:
the rows, and the nulls a `not_null` or `null_fraction` check of one column found)."""

from __future__ import annotations

from typing import Any, Callable

from openlineage.client.generated import data_quality_assertions_dataset as assertions_facet
from openlineage.client.generated import data_quality_metrics_dataset as metrics_facet

from ..definition.datachecks import dataset_checks

# OpenLineage knows two severities: 'error' blocks the pipeline, 'warn' does not (a drop check never blocks:
# its failing rows go to <dataset>_rejected); hybridflow's own on_fail is in each assertion's params
_SEVERITY = {"error": "error", "warn": "warn", "drop": "warn"}
_NULLS = ("not_null", "null_fraction")  # checks whose failing rows are a column's nulls


def facets(pipeline, dataset: str, records: list[dict], rows: int | None) -> dict[str, Any]:
    """The data-quality facets of `dataset` from its checks' outcome records (none without records);
    `rows`: the rows of the version the checks judged, when known."""
    if not records:
        return {}
    columns = {check.name: check.columns for check in dataset_checks(pipeline, dataset)}
    found: dict[str, Any] = {"dataQualityAssertions": assertions_facet.DataQualityAssertionsDatasetFacet(
        assertions=[_assertion(record, columns.get(record["check"], ()), pipeline.redact) for record in records])}
    metrics = _metrics(records, columns, rows)
    if metrics is not None:
        found["dataQualityMetrics"] = metrics
    return found


def _assertion(record: dict, columns: tuple[str, ...], redact: Callable[[str], str]) -> assertions_facet.Assertion:
    params: dict[str, Any] = {"on_fail": record["on_fail"], "status": record["status"]}
    for key in ("failing", "partition"):
        if record.get(key) is not None:
            params[key] = record[key]
    if record.get("detail"):
        params["detail"] = redact(record["detail"])
    value = record.get("value")
    return assertions_facet.Assertion(
        assertion=record["kind"], success=record["status"] == "passed", name=record["check"],
        column=columns[0] if len(columns) == 1 else None, severity=_SEVERITY.get(record["on_fail"]),
        actual=None if value is None else redact(str(value)), params=params)


def _metrics(records: list[dict], columns: dict[str, tuple[str, ...]],
             rows: int | None) -> metrics_facet.DataQualityMetricsDatasetFacet | None:
    """Counts of the whole version only: a check of one partition, or one that judged the rows before a
    drop check removed some, says nothing of the version's nulls."""
    whole = [r for r in records if r.get("partition") is None and r["on_fail"] != "drop"]
    if rows is None:
        rows = next((r["value"] for r in whole if r["kind"] == "row_count" and isinstance(r["value"], int)), None)
    nulls: dict[str, metrics_facet.ColumnMetrics] = {}
    for record in whole:
        checked = columns.get(record["check"], ())
        if record["kind"] in _NULLS and len(checked) == 1 and isinstance(record.get("failing"), int):
            nulls[checked[0]] = metrics_facet.ColumnMetrics(nullCount=record["failing"])
    if rows is None and not nulls:
        return None
    return metrics_facet.DataQualityMetricsDatasetFacet(columnMetrics=nulls, rowCount=rows)
