"""Ray Tune's progress for the display: trials finished out of all, and the best score so far. Tune
makes an instance of every callback class that RAY_TUNE_CALLBACKS names for each run in the driver
process; the Ray backend names one built from TrialCounter (with Tune's Callback as its other base,
see ray.py), which keeps the counts here for RayBackend.progress to read."""

from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass

CALLBACKS_VARIABLE = "RAY_TUNE_CALLBACKS"


@dataclass
class TuneRun:
    total: int | None = None  # None: unbounded (num_samples=-1)
    finished: int = 0  # completed or failed
    metric: str | None = None
    mode: str | None = None  # "max" or "min"
    best: float | None = None
    running: bool = True

    def phrase(self) -> str:
        trials = f"trials {self.finished}/{self.total}" if self.total else f"trials {self.finished} done"
        return trials if self.best is None else f"{trials} · best {self.metric} {self.best:.4g}"


class TuneProgress:
    """The newest Tune run of this process, updated from Tune's controller thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.run: TuneRun | None = None

    def phrase(self) -> str | None:
        with self._lock:
            return self.run.phrase() if self.run is not None and self.run.running else None

    def clear(self) -> None:
        with self._lock:
            self.run = None

    def started(self, total: int | None, metric: str | None, mode: str | None) -> None:
        with self._lock:
            self.run = TuneRun(total=total if total and total > 0 else None, metric=metric, mode=mode)

    def finished_trial(self) -> None:
        with self._lock:
            if self.run is not None:
                self.run.finished += 1

    def result(self, result: dict) -> None:
        with self._lock:
            run = self.run
            value = result.get(run.metric) if run is not None and run.metric else None
            if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
                return
            better = max if run.mode == "max" else min
            run.best = value if run.best is None else better(run.best, value)

    def ended(self) -> None:
        with self._lock:
            if self.run is not None:
                self.run.running = False


TUNING = TuneProgress()


class TrialCounter:
    """Tune callback methods (Tune calls them with keyword arguments) that feed TUNING."""

    def setup(self, total_num_samples: int | None = None, **info) -> None:
        TUNING.started(total_num_samples, *_metric_and_mode())

    def on_trial_result(self, result: dict | None = None, **info) -> None:
        TUNING.result(result or {})

    def on_trial_complete(self, **info) -> None:
        TUNING.finished_trial()

    def on_trial_error(self, **info) -> None:
        TUNING.finished_trial()

    def on_experiment_end(self, **info) -> None:
        TUNING.ended()


def _metric_and_mode() -> tuple[str | None, str | None]:
    """The metric and mode the run was given (TuneConfig's), which Tune does not pass to callbacks:
    read off tune.run's own variables, a few frames up from the controller that calls setup."""
    try:
        frame = sys._getframe(2)
        for _ in range(10):
            if frame is None:
                break
            metric, mode = frame.f_locals.get("metric"), frame.f_locals.get("mode")
            if isinstance(metric, str) and mode in ("max", "min"):
                return metric, mode
            frame = frame.f_back
    except Exception:  # another Tune version: no best score, the counts still work
        pass
    return None, None


def with_callback(current: str | None, name: str) -> str:
    """The RAY_TUNE_CALLBACKS value that also names `name` (once)."""
    names = [n.strip() for n in (current or "").split(",") if n.strip()]
    return ",".join(names if name in names else [*names, name])
