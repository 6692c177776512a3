"""`ctx`: what a stage function can ask for besides its inputs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ..errors import ConfigError


@dataclass
class StageContext:
    pipeline: str
    stage: str
    run_id: str
    backend: str
    params: Mapping[str, Any]
    log: logging.Logger
    scheduled_for: datetime | None = None  # the time the run is for: its cron tick, --for, or when it started
    _output_paths: dict[str, Path] = field(default_factory=dict, repr=False)
    _engines: dict[str, Any] = field(default_factory=dict, repr=False)
    _previous: dict[str, Path | None] = field(default_factory=dict, repr=False)
    _mlflow_record: Path | None = field(default=None, repr=False)  # where ctx.mlflow writes its calls down

    def __post_init__(self) -> None:
        self.params = MappingProxyType(dict(self.params))

    def output_path(self, name: str) -> Path:
        """The directory to write a `kind: files` output into; published when the stage succeeds."""
        if name not in self._output_paths:
            declared = ", ".join(self._output_paths) or "none"
            raise ConfigError(f"stage '{self.stage}' has no files output named '{name}' "
                              f"(its kind: files outputs: {declared})")
        return self._output_paths[name]

    def previous_output(self, name: str) -> Path | None:
        """The currently published version of one of this stage's `kind: files` outputs (read-only),
        or None before its first publication: what a champion/challenger stage compares against."""
        self.output_path(name)  # same check: a files output of this stage
        return self._previous.get(name)

    @property
    def mlflow(self):
        """Metrics, params, tags and a model alias for this stage's MLflow run (backends/stagemlflow.py)."""
        from .stagemlflow import StageMlflow

        return StageMlflow(self.stage, self._mlflow_record)

    def __getattr__(self, engine: str) -> Any:
        # ctx.spark / ctx.dask / ctx.ray exist only on stages that run on that engine
        engines = self.__dict__.get("_engines", {})
        if engine in engines:
            return engines[engine]
        from ..engines import engines

        if engine in engines() and not engine.startswith("_"):
            raise AttributeError(f"ctx.{engine} is only available on stages with backend: {engine} "
                                 f"(stage '{self.stage}' runs on {self.backend})")
        raise AttributeError(engine)
