"""`hybridflow check`: the declared checks of datasets, run against what is published now (or, for
an external input, against its files), without running any stage. Read in this process, as the
default (in-process) engine reads (Arrow): no engine is started for it."""

from __future__ import annotations

import logging

from ..backends import create
from ..backends.checkplan import Outcome
from ..definition.datachecks import dataset_checks
from ..definition.pipeline import Pipeline
from ..engines import DEFAULT
from ..errors import UsageError
from .datachecking import OutputChecks

log = logging.getLogger(__name__)


def check_datasets(pipeline: Pipeline, catalog, inputs, names: list[str]) -> list[Outcome]:
    """Every outcome of the checks of `names` (default: every dataset that declares checks)."""
    from ..diagnostics import did_you_mean

    known = set(pipeline.spec.datasets) | set(pipeline.dag.producer)
    for name in names:
        if name not in known:
            raise UsageError(f"no dataset named '{name}'{did_you_mean(name, known)}")
    chosen = names or sorted(n for n in known if dataset_checks(pipeline, n))
    backend = create(DEFAULT, None, catalog.home, store=pipeline.store if pipeline.uses_object_storage else None)
    checker = OutputChecks(pipeline, catalog)
    outcomes: list[Outcome] = []
    unpublished: list[str] = []
    for name in chosen:
        checks = dataset_checks(pipeline, name)
        if not checks:
            continue
        group_by: tuple[str, ...] = ()  # a published partitioned dataset is checked per partition, as its stage does
        if pipeline.is_external(name):
            source = inputs.external_source(name)
        else:
            current = catalog.current(name)
            if current is None:
                unpublished.append(name)
                continue
            source = current.source()
            group_by = source.partition_by
        outcomes += checker.judged(name, backend, source, checks, group_by=group_by)
    hint = f"run its stage first: hybridflow run {pipeline.shown_file}"
    if unpublished and (names or not outcomes):  # one named, or nothing at all to check: nothing to say yes to
        raise UsageError(f"dataset '{unpublished[0]}' has no published version yet", hint=hint)
    for name in unpublished:  # the others are still checked: a failed first run leaves some unpublished
        log.warning("dataset '%s' has no published version yet, so it was not checked (%s)", name, hint)
    return outcomes
