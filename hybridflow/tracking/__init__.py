"""What a run tells systems outside hybridflow: OpenLineage events (openlineage.py) and MLflow runs
(mlflowruns.py), each a subscriber of the run's events, made only when the pipeline file or the
environment asks for it; neither can fail or slow a run."""

from __future__ import annotations

import os

from ..results import Listener


def subscribers(pipeline, catalog, trigger: str) -> list[Listener]:
    """The run's tracking subscribers: none unless `lineage:` (or the OpenLineage environment) or
    `mlflow:` is set; the client libraries are imported only then."""
    found: list[Listener] = []
    if pipeline.spec.lineage is not None or os.environ.get("OPENLINEAGE_URL") or os.environ.get("OPENLINEAGE_CONFIG"):
        from .openlineage import LineageEvents

        found.append(LineageEvents.of(pipeline, catalog, trigger))
    if pipeline.spec.mlflow is not None:
        from .mlflowruns import MlflowRuns

        found.append(MlflowRuns(pipeline, catalog, trigger))
    return found
