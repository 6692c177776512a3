"""The checks of an external Parquet input that its footers answer, with no engine at all.

A row count is in every footer, and the newest value of a timestamp or date column is its max
statistic where every row group has one. When every check declared on an input is answered so
(row_count, row_count_change, freshness), the run judges it before the stages that read it get their
engine: a failed error-level check then starts no engine for them (the runner does not even start one
early). The outcomes are judged exactly as the engine's measures are (checkplan.judge); wherever the
footers cannot tell (no statistics, an INT96 column, CSV or JSON, any other check), they say nothing
and the consuming stage's engine runs the checks as before.
"""

from __future__ import annotations

from ..backends.checkplan import ROWS, CheckPlan, Outcome, judge
from ..definition.datachecks import dataset_checks
from ..definition.pipeline import Pipeline

FROM_FOOTERS = ("row_count", "row_count_change", "freshness")


def footer_outcomes(pipeline: Pipeline, inputs, dataset: str) -> list[Outcome] | None:
    """The outcomes of an external input's checks from its footers (`inputs`: the run's StageInputs,
    which read them once per run), or None when some check needs an engine. Raises DataError for a
    bad file or a schema not as declared, as reading it for the engine would."""
    checks = dataset_checks(pipeline, dataset) if pipeline.is_external(dataset) else []
    spec = pipeline.dataset(dataset)
    if not checks or spec.kind != "table" or spec.format != "parquet" or \
            any(c.kind not in FROM_FOOTERS for c in checks):
        return None
    inputs.external_source(dataset)  # its files and declared schema checked first, as on the engine path
    footers = inputs.external_footers(dataset)
    plan = CheckPlan(checks)
    values = {ROWS: footers.rows}
    for check in (c for c in checks if c.kind == "freshness"):
        if check.columns[0] not in footers.newest:  # a partition column, or a row group without statistics
            return None
        values[plan.alias[check.name]] = footers.newest[check.columns[0]]
    now = pipeline.run_moment()  # the run's moment, as the engine path judges freshness
    return [judge(dataset, c, values, plan, None, now) for c in plan.checks]


def failing_inputs(pipeline: Pipeline, inputs, stages: list[str]) -> set[str]:
    """The external inputs of `stages` whose footers already fail an error-level check: the runner
    starts no engine early for the stages that read them. A footer that cannot be read is left to the
    stage that reads it, which reports it."""
    from ..errors import HybridflowError

    failing = set()
    external = {d for s in stages for d in pipeline.stages[s].inputs if pipeline.is_external(d)}
    for dataset in sorted(external):
        try:
            outcomes = footer_outcomes(pipeline, inputs, dataset)
        except (HybridflowError, OSError):
            continue
        if outcomes and any(o.status == "failed" for o in outcomes):
            failing.add(dataset)
    return failing


def engines_worth_starting(pipeline: Pipeline, inputs, stages: list[str], ahead: list[str],  # noqa: PLR0913 - a run's plan
                           keep_going: bool) -> list[str]:
    """Of the engines `ahead` (those a run would start early, in order), the ones a stage that can
    still run needs: a stage reading an input whose footers fail an error-level check fails before
    its engine is needed, blocks the stages below it, and without --keep-going every stage after it."""
    if not ahead:
        return ahead
    failing = failing_inputs(pipeline, inputs, stages)
    doomed = [s for s in stages if failing & set(pipeline.stages[s].inputs)]
    if not doomed:
        return ahead
    blocked = set(doomed).union(*(pipeline.dag.descendants(s) for s in doomed))
    if not keep_going:
        blocked |= set(stages[stages.index(doomed[0]):])
    wanted = {pipeline.stages[s].backend for s in stages if s not in blocked}
    return [engine for engine in ahead if engine in wanted]
