"""What a Runner's runs are made with, built in one place from the pipeline, the run options and the
workspace: the catalog, the run store and its records, the run's events and who is told them, the
planner and the inputs; and, for each run, its engine pool and the stage executor with its publisher
and its errors. The Runner is left with the run itself: the lock, the plan, the loop over the stages
and the run's end."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from .. import tracking
from ..definition.pipeline import Pipeline
from ..errors import HybridflowError
from ..reporting.timeline import Timeline
from ..results import Listener, RunOptions, StageResult
from ..store.workspace import Workspace
from .enginepool import EnginePool
from .events import RunEvents
from .executor import StageExecutor
from .inputs import StageInputs
from .planner import Planner
from .publisher import Publisher
from .records import RunPush, RunRecords, RunReport
from .stageerrors import StageErrors
from .stopping import SignalState


class RunSession:
    """`listener` and `subscribers` are told the run's events after its records, report and trackers.
    `workspace`: where the runs read, publish and record, by default the pipeline's workdir. `pool`:
    makes each run's engine pool; a watch session's (warmpool.py) keeps its engines between runs."""

    def __init__(self, pipeline: Pipeline, options: RunOptions, *, listener: Listener,
                 subscribers: Sequence[Listener] = (), workspace: Workspace | None = None,
                 pool: Callable[..., EnginePool] = EnginePool) -> None:
        if workspace is not None and workspace.pipeline is not pipeline:
            raise ValueError("the workspace must be opened for this Pipeline object: Workspace(..., pipeline=pipeline)")
        self.pipeline = pipeline
        # where the workdir lives: decided once, for every run (the pipeline's, unless one is given)
        self.workspace = workspace or Workspace.of(pipeline)
        self.home = self.workspace.home
        self.catalog = self.workspace.catalog()
        self.store = self.workspace.run_store()
        self.stages = pipeline.dag.select(options.selection.only, options.selection.start, options.selection.end)
        self.records = RunRecords(pipeline, self.store, self.stages, self.workspace)
        pushed = [RunPush(self.records)] if self.workspace.remote is not None else []
        # OpenLineage and MLflow (tracking/) before the listener: what they failed to deliver ends its summary
        tracked = tracking.subscribers(pipeline, self.catalog, options.trigger)
        self.events = RunEvents([self.records, RunReport(pipeline, self.store, self.workspace), *pushed, *tracked,
                                 listener, *subscribers])
        self.planner = Planner(pipeline, self.workspace, options.force, runs=self.store)
        self.inputs = StageInputs(self.workspace, self.planner)
        self._pool = pool

    def engines(self, run_id: str, run_dir: Path, signals: SignalState, *, given: dict[str, Any], clusters: Any,
                gpu: Callable[[str], Any]) -> EnginePool:
        """A run's engine pool: its engines log to the run's directory and tell the run's events when they
        start. `given`: engines started by the caller, used and never stopped; `clusters`: the run's
        clusters (provisioning.RunClusters); `gpu`: an engine's name -> its GPU resources, or None."""
        return self._pool(self.pipeline, self.stages, run_dir / "logs", signals=signals, given=given, gpu=gpu,
                          on_started=self.events.engine_started, timeline=Timeline(self.store, run_id),
                          clusters=clusters, shared_workdir=self.workspace.shared_folder)

    def executor(self, engines: EnginePool, signals: SignalState, *, gpu: Any,
                 changed: Callable[[StageResult], None], end_run: Callable[[HybridflowError], None]) -> StageExecutor:
        """A run's stage executor, on the run's engines: each try of a stage hands what it returned to a
        publication of the publisher's, once."""
        errors = StageErrors(self.pipeline, self.inputs, self.home)
        publisher = Publisher(self.pipeline, self.catalog, self.inputs, errors, signals)
        return StageExecutor(self, engines, publisher, errors, signals, gpu=gpu, changed=changed, end_run=end_run)
