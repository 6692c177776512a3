"""What a run tells systems outside hybridflow: OpenLineage events (openlineage.py) and MLflow runs
(mlflowruns.py), each a subscriber of the run's events, made only when the pipeline file or the
environment asks for it; neither can fail or slow a run."""

from __future__ import annotations

import logging
import os

from ..errors import ConfigError, first_line
from ..installing import install_extras
from ..results import Listener

log = logging.getLogger("hybridflow")


def subscribers(pipeline, catalog, trigger: str) -> list[Listener]:
    """The run's tracking subscribers: none unless `lineage:` (or the OpenLineage environment) or
    `mlflow:` is set; the client libraries are imported only then."""
    found: list[Listener] = []
    asked = pipeline.spec.lineage is not None
    if asked or os.environ.get("OPENLINEAGE_URL") or os.environ.get("OPENLINEAGE_CONFIG"):
        try:
            from .openlineage import LineageEvents

            found.append(LineageEvents.of(pipeline, catalog, trigger))
        except ImportError:
            if asked:
                raise ConfigError("lineage: needs the OpenLineage client, which is not installed",
                                  hint=install_extras("lineage")) from None
            # the environment alone (set for another tool on this host) must not stop a run
            log.warning("OPENLINEAGE_URL or OPENLINEAGE_CONFIG is set, but the OpenLineage client is not "
                        "installed: this run sends no lineage events (%s)", install_extras("lineage"))
        except Exception as exc:  # noqa: BLE001 - a client the environment configures wrongly: no events
            if asked:
                raise
            log.warning("OpenLineage from the environment: %s; this run sends no lineage events",
                        pipeline.redact(first_line(exc)))
    if pipeline.spec.mlflow is not None:
        import importlib.util

        if importlib.util.find_spec("mlflow") is None:  # imported in the sender's thread, too late to say so
            raise ConfigError("mlflow: needs the MLflow client, which is not installed",
                              hint=install_extras("mlflow"))
        from .mlflowruns import MlflowRuns

        found.append(MlflowRuns(pipeline, catalog, trigger))
    return found
