"""A stage output's declared checks, run by the stage's engine over the version it just wrote, before
anything is committed: an error-level failure raises (so nothing of the stage is published), a
drop-level one rewrites the output without the failing rows and writes those, named by the check
they failed, to `<dataset>_rejected`, published with it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from ..backends.checkplan import (
    EXAMPLES,
    WHOLE_DATASET,
    CheckPlan,
    Outcome,
    Published,
    judge,
    partition_name,
    python_outcome,
)
from ..data.tables import TableSource
from ..definition.datachecks import CHECK_COLUMN, PYTHON_CHECK, Check, dataset_checks, expr_columns, rejected_name
from ..definition.pipeline import Pipeline
from ..definition.stagecode import import_function
from ..errors import DataError, HybridflowError, counted, first_line
from .filechecks import measure as files_then_engine
from .stopping import Terminated


@dataclass
class CheckedOutput:
    """What the checks left of an output: where its (possibly rewritten) rows are, their schema, the
    outcomes, and the quarantine written next to it (None when no check drops rows)."""

    directory: PurePath
    schema: Any
    outcomes: list[Outcome] = field(default_factory=list)
    rejected: tuple[PurePath, Any] | None = None


class OutputChecks:
    def __init__(self, pipeline: Pipeline, catalog) -> None:
        self.pipeline, self.catalog = pipeline, catalog

    def declared(self, dataset: str) -> list[Check]:
        return dataset_checks(self.pipeline, dataset)

    def plan_while_writing(self, dataset: str) -> CheckPlan | None:
        """What an unpartitioned output's checks measure, for its engine to take while it writes it (the
        plan `run` judges `measured` by), or None: no measured check, or partitioned."""
        measured = [c for c in self.declared(dataset) if c.kind != PYTHON_CHECK]
        return CheckPlan(measured) if measured and not self.pipeline.dataset(dataset).partition_by else None

    def run(self, run_id: str, dataset: str, backend, directory: PurePath, schema, log: logging.Logger,  # noqa: PLR0913 - what a check of one output needs
            published: Published | None, expected: tuple[str, ...] = (),
            measured: dict[str, Any] | None = None) -> CheckedOutput:
        """Check the output written to `directory` (a partitioned one per partition, `expected` the
        partitions it must hold: one it has no row for is judged empty; `measured` the measures of
        plan_while_writing, when its engine took them while writing); raise DataError when an
        error-level check fails."""
        checks = self.declared(dataset)
        checked = CheckedOutput(directory, schema)
        if not checks:
            return checked
        try:
            outcomes = self._measure(dataset, backend, directory, schema, checks, published, expected, measured)
            drop = [c for c in checks if c.on_fail == "drop"]
            if drop:
                checked = self._quarantine(run_id, dataset, backend, checked, drop, outcomes)
                if checked.directory != directory:  # rows were dropped: the other checks judge what is kept
                    kept = [c for c in checks if c.on_fail != "drop"]
                    outcomes = [o for o in outcomes if o.on_fail == "drop"] + self._measure(
                        dataset, backend, checked.directory, checked.schema, kept, published, expected)
        except (KeyboardInterrupt, Terminated, HybridflowError):
            raise
        except Exception as exc:  # the engine could not evaluate a check (a bad expr type, a python check raising)
            raise DataError(f"the checks of '{dataset}' could not run on {backend.name}: {first_line(exc)}") from exc
        order = [c.name for c in checks]
        checked.outcomes = sorted(outcomes, key=lambda o: (o.partition or "", order.index(o.check)))
        self._conclude(dataset, backend, directory, schema, checked.outcomes, log)
        return checked

    def _conclude(self, dataset: str, backend, directory: PurePath, schema, outcomes: list[Outcome],
                  log: logging.Logger) -> None:
        """Log what warned or dropped; raise ChecksFailed (with a few failing rows) when a check failed."""
        for outcome in outcomes:
            if outcome.status in ("warned", "dropped"):
                log.warning("check %s of %s %s: %s", outcome.check, dataset, outcome.status, outcome.detail)
        failed = [o for o in outcomes if o.status == "failed"]
        if not failed:
            return
        try:
            self._examples(dataset, backend, directory, schema, failed[0])
        except (KeyboardInterrupt, Terminated):
            raise
        except Exception as exc:  # the examples only illustrate: the failure is told without them
            log.warning("no example rows of check %s: %s", failed[0].check, first_line(exc))
        raise ChecksFailed(failed, outcomes)

    def _source(self, dataset: str, directory: PurePath, schema, partition_by=None) -> TableSource:
        partition_by = tuple(self.pipeline.dataset(dataset).partition_by) if partition_by is None else partition_by
        return TableSource(dataset, (directory,), "parquet", schema, partition_by, directory,
                           self.pipeline.store_of(directory))

    def _measure(self, dataset: str, backend, directory: PurePath, schema, checks: list[Check],  # noqa: PLR0913 - run's own
                 published: Published | None, expected: tuple[str, ...],
                 measured: dict[str, Any] | None = None) -> list[Outcome]:
        source = self._source(dataset, directory, schema)
        return self.judged(dataset, backend, source, checks, published, source.partition_by, expected, measured)

    def judged(self, dataset: str, backend, source: TableSource, checks: list[Check],  # noqa: PLR0913 - keyword defaults
               published: Published | None = None, group_by: tuple[str, ...] = (),
               expected: tuple[str, ...] = (), measured: dict[str, Any] | None = None) -> list[Outcome]:
        """The outcomes of `checks` over `source`, measured by `backend` (no row is dropped here), or
        judged from the `measured` values its engine took while writing it: per partition of `group_by`
        when given (freshness and python checks judge the whole)."""
        kinds = [c for c in checks if c.kind != PYTHON_CHECK]
        now = self.pipeline.run_moment()  # freshness against the time the run is for (a backfill's, --for)
        if group_by:
            outcomes = _per_partition(dataset, backend, backend.check_frame(source), CheckPlan(kinds, group_by),
                                      published, expected, now)
        else:
            plan = CheckPlan(kinds)
            values = measured if measured is not None else files_then_engine(backend, source, plan)
            outcomes = [judge(dataset, c, values, plan, published, now) for c in plan.checks]
        for check in (c for c in checks if c.kind == PYTHON_CHECK):
            function = import_function(self.pipeline.root, check.text)
            outcomes.append(python_outcome(dataset, check, function(backend.read(source)), backend.check_count))
        return outcomes

    def _quarantine(self, run_id: str, dataset: str, backend, checked: CheckedOutput, drop: list[Check],
                    outcomes: list[Outcome]) -> CheckedOutput:
        """Rewrite the output without the rows a drop check failed, and write those to its quarantine;
        with nothing to drop, the quarantine is an empty table (it always matches its dataset's version)."""
        from ..data.tables import write_arrow

        partition_by = tuple(self.pipeline.dataset(dataset).partition_by)
        if not any(o.status == "dropped" for o in outcomes):
            import pyarrow as pa

            empty = checked.schema.append(pa.field(CHECK_COLUMN, pa.string())).empty_table()
            local = self.catalog.new_staging(run_id, rejected_name(dataset))
            return CheckedOutput(checked.directory, checked.schema,
                                 rejected=(local, write_arrow(empty, local, (), 1 << 27)))
        plan = CheckPlan(drop)
        frame = backend.check_frame(self._source(dataset, checked.directory, checked.schema))
        kept, failing = backend.check_split(frame, plan, drop)
        directory = self.catalog.new_staging(run_id, dataset + ".kept", remote=backend.writes_object_storage)
        rejected = self.catalog.new_staging(run_id, rejected_name(dataset), remote=backend.writes_object_storage)
        schema = backend.write(kept, directory, partition_by)
        return CheckedOutput(directory, schema, rejected=(rejected, backend.write(failing, rejected, ())))

    def _examples(self, dataset: str, backend, directory: PurePath, schema, outcome: Outcome) -> None:
        """A few of the rows the first failed row-level check found, its own columns only."""
        check = next(c for c in self.declared(dataset) if c.name == outcome.check)
        if not check.row_level or not outcome.failing:
            return
        columns = expr_columns(check.text) if check.kind == "expr" else list(check.columns)
        if outcome.partition is not None:  # which partition each example is from
            columns = [c for c in self.pipeline.dataset(dataset).partition_by if c not in columns] + columns
        frame = backend.check_frame(self._source(dataset, directory, schema))
        failing = backend.check_split(frame, CheckPlan([check]), [check])[1]
        outcome.examples = backend.check_head(failing, [c for c in columns if c in schema.names], EXAMPLES)


def _per_partition(dataset: str, backend, frame, plan: CheckPlan, published: Published | None,  # noqa: PLR0913
                   expected: tuple[str, ...], now) -> list[Outcome]:
    """Each check of each partition, measured in one grouped pass; an `expected` partition without a
    row is judged empty, and an output without any row is judged as one empty whole."""
    groups = {partition_name(plan.group_by, key): values
              for key, values in backend.check_measure_groups(frame, plan).items()}
    groups |= {name: plan.empty() for name in expected if name not in groups}
    if not groups:
        return [judge(dataset, c, plan.empty(), plan, published, now) for c in plan.checks]
    outcomes = [judge(dataset, c, groups[name], plan, published, now, partition=name)
                for name in sorted(groups) for c in plan.checks if c.kind not in WHOLE_DATASET]
    whole = plan.whole(list(groups.values()))
    return outcomes + [judge(dataset, c, whole, plan, published, now) for c in plan.checks if c.kind in WHOLE_DATASET]


def published_counts(current, whole: bool = True) -> Published:
    """What row_count_change compares with: the current version's row count (`whole`: False when only
    part of the dataset was written) and its partitions' counts, from its manifest."""
    if current is None:
        return Published()
    return Published(current.rows if whole else None, current.manifest.get("partition_rows"))


def carried_checks(manifest: dict, unchanged: tuple[str, ...]) -> list[dict]:
    """The recorded check outcomes of the partitions an incremental stage carried over untouched."""
    kept = set(unchanged)
    return [record for record in manifest.get("checks") or () if record.get("partition") in kept]


class ChecksFailed(DataError):
    """An error-level check failed: the stage publishes nothing (exit 65, as a broken contract)."""

    def __init__(self, failed: list[Outcome], outcomes: list[Outcome]) -> None:
        more = f" (and {counted(len(failed) - 1, 'more failed check')})" if len(failed) > 1 else ""
        super().__init__(failed[0].line() + more,
                         hint="the previous version stays current; fix the data or the stage, or make the check "
                              "on_fail: warn")
        self.outcomes = outcomes


class InputChecks:
    """The checks of external inputs, run once per run when a stage first reads the input, before that
    stage's function starts: from the input's footers, before the stage's engine is needed, where they
    answer every check (footerchecks), else by that stage's engine; a failed error-level check fails
    the stage."""

    def __init__(self, pipeline: Pipeline, inputs) -> None:
        self.pipeline, self.inputs = pipeline, inputs
        self.checker = OutputChecks(pipeline, None)
        self._done: dict[str, list[Outcome]] = {}

    def before_engine(self, datasets: list[str], records: dict[str, list[dict]], log: logging.Logger) -> None:
        """The checks the footers answer, judged before the stage gets its engine."""
        from .footerchecks import footer_outcomes

        for dataset in datasets:
            if dataset not in self._done:
                outcomes = footer_outcomes(self.pipeline, self.inputs, dataset)
                if outcomes is None:
                    continue
                self._done[dataset] = outcomes
            self._conclude(dataset, records, log)

    def before_reading(self, datasets: list[str], backend, records: dict[str, list[dict]],
                       log: logging.Logger) -> None:
        for dataset in datasets:
            if dataset in records:  # judged from its footers before the engine (before_engine)
                continue
            checks = dataset_checks(self.pipeline, dataset) if self.pipeline.is_external(dataset) else []
            if not checks or self.pipeline.dataset(dataset).kind != "table":
                continue
            if dataset not in self._done:
                try:
                    source = self.inputs.table_for(dataset, backend)  # as the stage will read it
                    self._done[dataset] = self.checker.judged(dataset, backend, source, checks)
                except (KeyboardInterrupt, Terminated, HybridflowError):
                    raise
                except Exception as exc:
                    raise DataError(f"the checks of input '{dataset}' could not run on {backend.name}: "
                                    f"{first_line(exc)}") from exc
            self._conclude(dataset, records, log)

    def _conclude(self, dataset: str, records: dict[str, list[dict]], log: logging.Logger) -> None:
        """Record the input's outcomes on the stage, log what did not pass, raise when one failed."""
        outcomes = self._done[dataset]
        records[dataset] = [o.record() for o in outcomes]
        for outcome in outcomes:
            if outcome.status != "passed":
                log.warning("check %s of input %s %s: %s", outcome.check, dataset, outcome.status, outcome.detail)
        failed = [o for o in outcomes if o.status == "failed"]
        if failed:
            raise ChecksFailed(failed, outcomes)
