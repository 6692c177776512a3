"""`ctx.mlflow`: what a stage's code tells MLflow (metrics, params, tags, a registered model's alias),
on every engine. The calls are only written down, one JSON line each, next to the stage's log; the
run's process sends them to the stage's MLflow run once the stage has ended (tracking/mlflowruns.py).
So stage code never talks to the tracking server itself, a stage running in a child process records
them too, and a pipeline without `mlflow:` sends them nowhere."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..errors import ConfigError


class StageMlflow:
    def __init__(self, stage: str, record: Path | None) -> None:
        self.stage = stage
        self.record = record  # None: the stage runs outside a run (hybridflow.testing), nothing is kept

    def log_metric(self, key: str, value: float, step: int | None = None) -> None:
        """One metric of the stage's MLflow run (at `step`, for a curve)."""
        number = float(value)
        if math.isnan(number):
            raise ConfigError(f"ctx.mlflow.log_metric('{key}'): the value is NaN", hint="log a number")
        self._write("metric", key=str(key), value=number, step=step, timestamp=int(time.time() * 1000))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        for key, value in metrics.items():
            self.log_metric(key, value, step)

    def log_param(self, key: str, value: Any) -> None:
        self._write("param", key=str(key), value=_text(value))

    def log_params(self, params: Mapping[str, Any]) -> None:
        for key, value in params.items():
            self.log_param(key, value)

    def set_tag(self, key: str, value: Any) -> None:
        self._write("tag", key=str(key), value=_text(value))

    def set_model_alias(self, alias: str, model: str | None = None) -> None:
        """Point the registered model's `alias` (e.g. champion) at the version registered from the
        model this stage read (a `kind: files` input declared `mlflow: {model: ...}`); `model`: the
        registered model's name, needed only when the stage reads more than one."""
        self._write("alias", alias=str(alias), model=model)

    def _write(self, kind: str, **fields: Any) -> None:
        if self.record is None:
            return
        with open(self.record, "a", encoding="utf-8") as out:
            out.write(json.dumps({"kind": kind, **fields}) + "\n")


def recorded(record: Path) -> Iterator[dict[str, Any]]:
    """What a stage's code recorded, in order; nothing when it recorded nothing."""
    try:
        lines = record.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return
    for line in lines:
        if line.strip():
            yield json.loads(line)


def record_of(log_path: str | Path) -> Path:
    """The record next to a stage's log (<run>/logs/<stage>.log -> <stage>.mlflow.jsonl)."""
    return Path(log_path).with_suffix(".mlflow.jsonl")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)
