"""The OpenLineage identity of a run and of its stages' runs: their namespace, and their run ids,
the same wherever they are made (hybridflow's own events, Spark's listener nesting its events under
a stage's run). Imports no OpenLineage client."""

from __future__ import annotations

import os
import uuid

DEFAULT_NAMESPACE = "hybridflow"


def namespace_of(pipeline) -> str:
    spec = pipeline.spec.lineage
    return (spec and spec.namespace) or os.environ.get("OPENLINEAGE_NAMESPACE") or DEFAULT_NAMESPACE


def run_uuid(namespace: str, pipeline: str, run_id: str, stage: str | None = None) -> str:
    """A run's id, the same for every event of it (OpenLineage wants a UUID, hybridflow's run ids
    are not: the pipeline's run id is in its tags facet)."""
    key = f"hybridflow:{namespace}:{pipeline}:{run_id}" + (f":{stage}" if stage else "")
    return str(uuid.uuid5(uuid.NAMESPACE_URL, key))
