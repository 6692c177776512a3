"""The OpenLineage identity of a run and of its stages' runs: their namespace, and their run ids,
the same wherever they are made (hybridflow's own events, Spark's listener nesting its events under
a stage's run). Imports no OpenLineage client."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

DEFAULT_NAMESPACE = "hybridflow"


def namespace_of(pipeline) -> str:
    spec = pipeline.spec.lineage
    return (spec and spec.namespace) or os.environ.get("OPENLINEAGE_NAMESPACE") or DEFAULT_NAMESPACE


def run_uuid(namespace: str, pipeline: str, run_id: str, stage: str | None = None) -> str:
    """A run's id, the same for every event of it (OpenLineage wants a UUID, hybridflow's run ids
    are not: the pipeline's run id is in its tags facet)."""
    key = f"hybridflow:{namespace}:{pipeline}:{run_id}" + (f":{stage}" if stage else "")
    return str(uuid.uuid5(uuid.NAMESPACE_URL, key))


@dataclass(frozen=True)
class LineageTarget:
    """Where a pipeline's OpenLineage events go (in the OpenLineage Java client's transport keys) and
    under which names: what an engine with lineage of its own (Spark's listener) needs to nest its
    events under a stage's run."""

    pipeline: str
    namespace: str
    transport: dict[str, str]  # the Java client's transport.* (an API key among them: a secret)
    timeout: float

    @classmethod
    def of(cls, pipeline) -> LineageTarget | None:
        """For a pipeline with `lineage:`; None without (the OpenLineage environment alone configures
        hybridflow's events, not Spark's)."""
        spec = pipeline.spec.lineage
        if spec is None:
            return None
        if spec.transport == "file":
            path = Path(spec.path)
            transport = {"type": "file", "location": str(path if path.is_absolute() else pipeline.root / path)}
        else:
            transport = {"type": "http", "url": spec.url, "endpoint": "/" + spec.endpoint.lstrip("/"),
                         "timeoutInMillis": str(int(spec.timeout * 1000))}
            if spec.api_key:
                transport.update({"auth.type": "api_key", "auth.apiKey": spec.api_key})
        return cls(pipeline.name, namespace_of(pipeline), transport, spec.timeout)
