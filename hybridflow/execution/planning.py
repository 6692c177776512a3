"""What a run would do, decided without running anything: a pure function of the pipeline, the
workdir's state (its published versions and run records) and the options. `hybridflow plan`, a dry
run, and a run deciding which engines to start early all ask plan(); the run session asks the same
functions again on the real inputs as each stage comes (see executor.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..data import storage
from ..definition.pipeline import Pipeline
from ..results import PlannedInput, Selection
from ..store.catalog import Catalog
from ..store.workspace import Workspace
from .planner import SKIP, Decision, Planner


@dataclass
class Plan:
    """What a run would do now: each selected stage's decision (run, skip or incremental, and why)
    and where each of its inputs would come from."""

    pipeline: Pipeline
    decisions: dict[str, Decision]
    inputs: dict[str, list[PlannedInput]]

    @property
    def to_run(self) -> list[str]:
        return [stage for stage, decision in self.decisions.items() if decision.action != SKIP]

    @property
    def clusters(self) -> dict[str, str]:
        """Engine -> the cluster the run would bring up for it (backends.<engine>.cluster), in words."""
        from .provisioning import cluster_spec

        found = {}
        for stage in self.to_run:
            engine = self.pipeline.stages[stage].backend
            cluster = cluster_spec(self.pipeline, engine)
            if cluster is not None and engine not in found:
                found[engine] = (f"ssh: head {cluster.head}, workers on {', '.join(cluster.workers)}"
                                 if cluster.provider == "ssh" else f"command: {self.pipeline.redact(cluster.up)}")
        return found

    @property
    def missing(self) -> list[tuple[str, PlannedInput]]:
        return [(stage, item) for stage, items in self.inputs.items() for item in items if item.state == "missing"]


def plan(pipeline: Pipeline, selection: Selection | None = None, force: bool | set[str] = False, *,
         runs=None) -> Plan:
    """The plan of a run of `selection` (default: every stage) forcing `force` (True: every stage).
    runs (a state.RunStore): the workdir's, opened here when not given."""
    selection = selection or Selection()
    workspace = Workspace.of(pipeline)
    catalog = workspace.catalog()
    stages = pipeline.dag.select(selection.only, selection.start, selection.end)
    planner = Planner(pipeline, workspace, force, runs=runs if runs is not None else workspace.run_store())
    return Plan(pipeline, decide(pipeline, stages, planner), planned_inputs(pipeline, stages, catalog))


def decide(pipeline: Pipeline, stages: list[str], planner: Planner) -> dict[str, Decision]:
    """What each of `stages` would do now: an input an earlier stage will rebuild makes the stage run
    (a run decides again, on the real inputs, when it gets there)."""
    rebuilt: dict[str, str] = {}
    decisions = {}
    planner.warm(stages)
    for stage in stages:
        decision = planner.decide(stage, rebuilt)
        decisions[stage] = decision
        if decision.action != SKIP:
            for ds in pipeline.stages[stage].outputs:
                rebuilt.setdefault(ds, stage)
    return decisions


def planned_inputs(pipeline: Pipeline, stages: list[str], catalog: Catalog) -> dict[str, list[PlannedInput]]:
    """For each of `stages`, where each of its inputs will come from."""
    produced_here = {ds for s in stages for ds in pipeline.stages[s].outputs}
    return {stage: [_planned_input(pipeline, catalog, ds, produced_here) for ds in pipeline.stages[stage].inputs]
            for stage in stages}


def _planned_input(pipeline: Pipeline, catalog: Catalog, dataset: str, produced_here: set[str]) -> PlannedInput:
    if dataset in produced_here:
        return PlannedInput(dataset, "produced in this run", f"by stage {pipeline.dag.producer[dataset]}")
    if pipeline.is_external(dataset):
        path = pipeline.external_path(dataset)
        found = storage.exists(path, pipeline.filesystem_of(path))
        return PlannedInput(dataset, "external" if found else "missing", storage.uri_of(path))
    version = catalog.current(dataset)
    if version:
        return PlannedInput(dataset, "published", f"version {version.id}")
    return PlannedInput(dataset, "missing", f"never published by stage {pipeline.dag.producer[dataset]}")
