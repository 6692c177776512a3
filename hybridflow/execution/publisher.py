"""A stage's outputs, from what its function returned to what readers see: the returned frames
checked against the declared outputs, written to staging, checked against their contract, hashed,
described by a manifest and moved into an immutable version (prepare), then made current all
together (commit). Incremental outputs carry their unchanged partitions over from the last version.
Each try of a stage is one Publication, which decides where each of its outputs is staged."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from ..data.contract import declared_schema, schema_differences
from ..data.tables import ensure_schema_file
from ..definition.datachecks import rejected_name
from ..definition.pipeline import Pipeline
from ..errors import DataError, HybridflowError, StageError, counted
from ..results import StageResult
from ..settings import TARGET_FILE_SIZE
from ..store.catalog import Catalog, Version
from ..store.incremental import carry_over, schema_types
from .datachecking import CheckedOutput, ChecksFailed, OutputChecks, carried_checks, published_counts
from .inputs import StageInputs
from .planner import INCREMENTAL, Decision
from .stageerrors import StageErrors
from .stopping import SignalState, Terminated

if TYPE_CHECKING:  # imported where used: validate and a skipped run never load it
    import pyarrow as pa


@dataclass(frozen=True)
class Written:
    """A table output written to its staging directory, not yet checked or committed."""

    directory: PurePath  # a local directory, or a prefix in object storage (storage.ObjectPath)
    schema: pa.Schema
    measured: dict[str, Any] | None = None  # its checks' measures, taken while it was written



class Publisher:
    """A run's outputs, published: each try of a stage begins a Publication of its own."""

    def __init__(self, pipeline: Pipeline, catalog: Catalog, inputs: StageInputs, errors: StageErrors,
                 signals: SignalState) -> None:
        self.pipeline, self.catalog, self.inputs, self.errors, self.signals = pipeline, catalog, inputs, errors, signals
        self.checks = OutputChecks(pipeline, catalog)

    def begin(self, run_id: str, result: StageResult, backend, log: logging.Logger, decision: Decision) -> Publication:
        return Publication(self, run_id, result, backend, log, decision)


class Publication:
    """One try of a stage's outputs, from what its function returned to their commit. Where each output
    is staged is decided here, once: a `kind: files` output's folder as the try begins (the stage fills
    it: ctx.files_dir), a table's directory or prefix as it is written; the executor hands over only
    what the stage returned."""

    def __init__(self, publisher: Publisher, run_id: str, result: StageResult, backend, log: logging.Logger,
                 decision: Decision) -> None:
        self.publisher, self.pipeline, self.catalog = publisher, publisher.pipeline, publisher.catalog
        self.run_id, self.result, self.backend, self.log, self.decision = run_id, result, backend, log, decision
        self.stage = result.name
        self.prepared: list[Version] = []  # the new versions, until committed
        self.committing = False  # from then on the catalog's journal finishes or undoes the commit
        self.files_dirs: dict[str, Path] = {
            ds: self.catalog.new_staging(run_id, ds)
            for ds in self.pipeline.stages[self.stage].outputs if self.pipeline.dataset(ds).kind == "files"}

    def frames_of(self, returned: Any) -> dict[str, Any]:
        """The stage's table outputs by name, checked against what it declared."""
        stage, backend = self.stage, self.backend
        spec = self.pipeline.stages[stage]
        tables = [ds for ds in spec.outputs if self.pipeline.dataset(ds).kind == "table"]
        if isinstance(returned, dict):
            unknown = [k for k in returned if k not in spec.outputs]
            if unknown:
                raise StageError(f"stage '{stage}' returned '{unknown[0]}', which is not one of its outputs "
                                 f"({', '.join(spec.outputs) or 'none'})")
            frames = {k: v for k, v in returned.items() if k in tables}
        elif returned is None:
            frames = {}
        elif len(tables) == 1:
            frames = {tables[0]: returned}
        else:
            raise StageError(f"stage '{stage}' returned a {type(returned).__name__}; with "
                             f"{len(tables)} table outputs it must return a dict keyed by output name")
        missing = [ds for ds in tables if ds not in frames]
        if missing:
            raise StageError(f"stage '{stage}' did not return its output '{missing[0]}'",
                             hint="return the frame, or a dict keyed by output name")
        for name, frame in frames.items():
            if not backend.is_frame(frame):
                raise StageError(f"stage '{stage}' returned a {_type_name(frame)} for output '{name}'; "
                                 f"the {backend.name} backend writes {backend.frame_types}")
        return frames

    def write(self, dataset: str, frame: Any) -> Written:
        """A table output written by its engine to a staging directory (or prefix) of its own."""
        backend = self.backend
        staging = self.catalog.new_staging(self.run_id, dataset, remote=backend.writes_object_storage)
        ds = self.pipeline.dataset(dataset)
        target = ds.target_file_size or backend.target_file_size or TARGET_FILE_SIZE
        try:
            plan = self.publisher.checks.plan_while_writing(dataset)
            if plan is None:
                return Written(staging, backend.write(frame, staging, tuple(ds.partition_by), target))
            return Written(staging, *backend.write_measured(frame, staging, tuple(ds.partition_by), target, plan))
        except (KeyboardInterrupt, Terminated, HybridflowError):
            raise
        except Exception as exc:  # engines compute lazily: the stage's own code fails here
            raise self.publisher.errors.of(exc, self.log, self.stage) from exc

    def prepare(self, produced: dict[str, Any]) -> None:
        """Write the frames of `produced` (a child's `Written` already is) and check every output, each
        into a version of its own that commit makes current: an output that breaks its contract leaves
        every dataset of the stage as it was."""
        spec = self.pipeline.stages[self.stage]
        inputs = {ds: self.publisher.inputs.version_of(ds) for ds in spec.inputs}
        try:
            for dataset in spec.outputs:
                self.prepared += self._prepare(dataset, produced, inputs)
        except BaseException:
            self.discard()  # never to be committed: nothing of the try stays in versions/
            raise

    def commit(self) -> None:
        """Point every output at its new version, all together. A stop request before this leaves
        everything as it was; one that arrives during it waits until all the outputs are committed."""
        signals, result, prepared = self.publisher.signals, self.result, self.prepared
        signals.check()
        self.committing = True
        try:
            with signals.deferred():
                self.catalog.commit_together(prepared)
        finally:
            self.publisher.inputs.committed(version.dataset for version in prepared)
        result.outputs.update({version.dataset: version.id for version in prepared})
        tables = [v.rows for v in prepared if v.rows is not None]
        result.rows_out = sum(tables) if tables else None
        result.bytes_out = sum(v.bytes for v in prepared)

    def discard(self) -> None:
        """The try failed or stopped before its commit began: its prepared versions go."""
        if not self.committing:
            for version in self.prepared:
                self.catalog.discard(version)
            self.prepared = []

    def _prepare(self, dataset: str, produced: dict[str, Any], inputs: dict[str, str]) -> list[Version]:
        """The output's version, and its quarantine's when a check drops rows."""
        stage, run_id, decision, log = self.stage, self.run_id, self.decision, self.log
        ds = self.pipeline.dataset(dataset)
        partition_by = tuple(ds.partition_by)
        written, checked = None, None
        if ds.kind == "files":
            staging = self.files_dirs[dataset]
        elif dataset in produced:
            output = produced[dataset]
            if not isinstance(output, Written):
                output = self.write(dataset, output)
            staging, written = output.directory, output.schema
            checked = self._check(dataset, output)
            staging, written = checked.directory, checked.schema
        else:
            staging = self.catalog.new_staging(run_id, dataset)
        if decision.action == INCREMENTAL:
            previous = decision.previous[dataset]
            if written is not None and previous.schema is not None:
                drift = schema_differences(dict(zip(previous.schema.names, previous.schema.types)), written)
                if drift:  # new partitions cannot sit beside the kept ones
                    raise DataError(f"incremental output '{dataset}' changed schema against its kept partitions: "
                                    f"{'; '.join(drift)}", hint=f"reprocess every partition: hybridflow run "
                                                                 f"{self.pipeline.shown_file} --force {stage}")
            written = written or previous.schema
            filesystem = self.pipeline.filesystem_of(staging)
            carry_over(dataset, staging, previous.manifest, decision.changes, partition_by, schema_types(written),
                       lambda files, into: self.catalog.bring(previous, files, into), filesystem)
            # every partition removed: still a schema
            ensure_schema_file(staging, written, partition_by, filesystem)
            log.info("output %s: %s written, %d carried over, %d removed", dataset,
                     counted(len(decision.changes.changed), "partition"), len(decision.changes.unchanged),
                     len(decision.changes.removed))
        records = self.result.checks.get(dataset)
        if records is not None and decision.action == INCREMENTAL:  # untouched partitions keep their results
            records = records + carried_checks(decision.previous[dataset].manifest, decision.changes.unchanged)
        versions = [self.catalog.prepare(dataset, staging, kind=ds.kind, stage=stage, run_id=run_id, inputs=inputs,
                                         declared=declared_schema(ds.schema_), partition_by=partition_by,
                                         written=written, checks=records,
                                         fingerprint=decision.fingerprint.record() if decision.fingerprint else None)]
        if checked is not None and checked.rejected is not None:
            directory, schema = checked.rejected
            versions.append(self.catalog.prepare(rejected_name(dataset), directory, kind="table", stage=stage,
                                                 run_id=run_id, inputs=inputs, written=schema, checks=records))
        return versions

    def _check(self, dataset: str, output: Written) -> CheckedOutput:
        """The output's declared checks, run by its engine; their outcomes go on the stage's result. An
        incremental stage wrote only its new or changed partitions: those are checked."""
        decision, result = self.decision, self.result
        if not self.publisher.checks.declared(dataset):  # nothing to check: no need of what is published
            return CheckedOutput(output.directory, output.schema)
        incremental = decision.action == INCREMENTAL
        published = published_counts(self.catalog.current(dataset), whole=not incremental)
        # a changed partition published before that the stage wrote no row for is checked as empty
        emptied = tuple(k for k in decision.changes.changed if k in (published.partitions or {})) if incremental else ()
        try:
            checked = self.publisher.checks.run(self.run_id, dataset, self.backend, output.directory, output.schema,
                                                self.log, published, emptied, output.measured)
        except ChecksFailed as failed:
            result.checks[dataset] = [o.record() for o in failed.outcomes]
            raise
        if checked.outcomes:
            result.checks[dataset] = [o.record() for o in checked.outcomes]
        return checked


def _type_name(value: Any) -> str:
    """'pandas DataFrame', 'polars LazyFrame': every engine has a DataFrame, so the package says whose."""
    package = type(value).__module__.split(".")[0]
    return type(value).__name__ if package == "builtins" else f"{package} {type(value).__name__}"
