"""The engines of a watch session (hybridflow run --watch): started by the first run that needs
each, lent to every run after it, and stopped only when the session ends. A run that finds its
engine's settings changed in the YAML gets a fresh engine; one that finds the code its engine's
stages reach changed has the engine load the new code, or restarts the engine where it cannot
(its workers keep the modules they imported)."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from pathlib import Path
from typing import Any, Callable

from ..definition.codereach import CodeIndex
from ..definition.pipeline import Pipeline
from ..reporting.timeline import ENGINE_STOP
from ..store.lock import lease_seconds
from .enginepool import EnginePool
from .stopping import SignalState


class WarmPool(EnginePool):
    """One EnginePool for a whole session; Runner(pool=warm.for_run) lends it to each run."""

    def __init__(self, pipeline: Pipeline, log_dir: Path,
                 notice: Callable[[str], None] = lambda text: None) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(pipeline, list(pipeline.stages), log_dir, signals=SignalState())
        self.notice = notice  # says when an engine is restarted, and why
        self._code: dict[str, str] = {}  # engine -> digest of the code its stages reached when it got it
        self._started_with: dict[str, Any] = {}  # engine -> its backends.<name> settings when it started
        self._launchers: list[threading.Thread] = []  # earlier runs' background-start threads

    def for_run(self, pipeline: Pipeline, stages: list[str], log_dir: Path, *, signals: SignalState,  # noqa: PLR0913 - EnginePool's own arguments: it is called as EnginePool is
                given: dict[str, Any] | None = None, gpu: Callable[[str], Any] = lambda name: None,
                on_started: Callable[[str, float], None] = lambda name, seconds: None, timeline=None,
                clusters=None, shared_workdir: Path | None = None) -> WarmPool:
        """The pool for one run (Runner's `pool`, called as EnginePool would be): its pipeline as loaded
        now, its listener and timeline; engine start seconds count only for the run that paid them."""
        self._settle_early_starts()
        self.pipeline, self.stages, self.signals, self.gpu = pipeline, stages, signals, gpu
        self.on_started, self.seconds, self.shared_workdir = on_started, {}, shared_workdir
        # the session's first run brings clusters up; they stay, as its engines do, and go at its end
        self.clusters = self.clusters or clusters
        if self.clusters is not None:  # alive to reapers on other machines while the session lasts
            self.clusters.keep_beating(lease_seconds() / 3)
        self._given = dict(given or {})
        if timeline is not None:
            self.timeline = timeline
        for name in list(self._started):
            if self._started_with.get(name) != _settings(pipeline, name):
                self.notice(f"restarting {name}: its settings changed")
                self._stop(name)
        return self

    def _settle_early_starts(self) -> None:
        """Between runs: the last run's background starts are over (one may outlive a failed run), so
        this process's streams go back to the terminal's fds, and the next run starts afresh. The
        starting threads themselves stay until shutdown: engines' daemons may die with them (Ray)."""
        self._wait_for_background_starts()
        self._launchers.extend(early.thread for early in self._background)
        self._background = []
        self._early = {}
        if self._streams is not None:
            self._streams.restore()
            self._streams = None

    def _start_engine(self, name: str, early=None) -> float:
        self._started_with[name] = _settings(self.pipeline, name)  # what it starts with: compared later
        self._code[name] = self._code_digest(name)
        return super()._start_engine(name, early)

    def get(self, name: str):
        warm = name in self._started and name not in self._early  # not one this run is starting
        if warm and self._code.get(name) != self._code_digest(name):
            engine = self._started[name]
            with contextlib.suppress(Exception):
                if engine.reload_code(self._stage_code()):
                    self._code[name] = self._code_digest(name)
            if self._code.get(name) != self._code_digest(name):
                self.notice(f"restarting {name}: its workers cannot load the changed stage code")
                self._stop(name)
        return super().get(name)

    def _code_digest(self, name: str) -> str:
        """What the stages on engine `name` reach of the project's code (codereach), as one digest:
        an edit elsewhere leaves the engine as it is."""
        index = CodeIndex(self.pipeline.root)
        digests = sorted(item for stage, spec in self.pipeline.stages.items() if spec.backend == name
                         for item in index.reach(spec.run).digests.items())
        return hashlib.sha256(repr(digests).encode()).hexdigest()

    def _stop(self, name: str) -> None:
        """Restart `name`: stopped, and its cluster taken down (the next start brings a fresh one up)."""
        engine = self._started.pop(name)
        with contextlib.suppress(Exception), self.timeline.span(ENGINE_STOP, detail=name):
            engine.stop()
        self._take_down(name)

    def keep_only(self, needed: set[str]) -> None:
        """Engines stay warm between the stages of a run, and between runs."""

    def stop_all(self) -> None:
        """A run ends; its engines stay for the next one (shutdown() stops them)."""

    def shutdown(self) -> None:
        """The session ends: every engine it started stops (its clusters go down: what failed to is
        said), and the threads that started them end."""
        super().stop_all()
        if self.clusters is not None:
            self.clusters.stop_beating()
        for problem in self.clusters.problems if self.clusters is not None else ():
            self.notice(f"warning: {problem}")
        self._engines_stopped.set()  # only now: the engines they launched are stopped
        for thread in self._launchers:
            thread.join()
        self._launchers.clear()


def _settings(pipeline: Pipeline, name: str):
    settings = pipeline.engine_settings(name)
    return settings.model_dump(mode="json") if hasattr(settings, "model_dump") else settings
