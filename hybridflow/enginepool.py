"""The engines of one run: each started the first time a stage needs it, reused by the stages after
it, replaced after a timeout (the old one may still hold the stage's work), and stopped, every one,
when the run ends. Engines a caller started (tests, a notebook's session) are used, never stopped."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from . import backends, processes
from .backends.base import EngineOutput
from .pipeline import Pipeline
from .stagecode import module_file
from .stopping import SignalState, Terminated
from .timeline import ENGINE_START, ENGINE_STOP, Timeline

STOP_WAIT = 90.0  # seconds the engines of a run may take to stop before their processes are killed


class EnginePool:
    def __init__(self, pipeline: Pipeline, stages: list[str], log_dir: Path, *, signals: SignalState,
                 given: dict[str, Any] | None = None, gpu: Callable[[str], Any] = lambda name: None,
                 on_started: Callable[[str, float], None] = lambda name, seconds: None,
                 timeline: Timeline | None = None) -> None:
        self.pipeline = pipeline
        self.stages = stages
        self.log_dir = log_dir
        self.signals = signals
        self.gpu = gpu  # engine name -> its GPU resources (a gpu.EngineGpu), or None
        self.on_started = on_started
        self.timeline = timeline or Timeline()
        self.seconds: dict[str, float] = {}  # engine -> start-up seconds, for engines started here
        self.output = EngineOutput(log_dir / "engines.log", pipeline.secrets)  # redacted engines.log
        self._given = dict(given or {})
        self._started: dict[str, Any] = {}

    def get(self, name: str):
        """The engine `name`, started on first use."""
        if name in self._given:
            return self._given[name]
        if name not in self._started:
            self._start(name)
        return self._started[name]

    def _start(self, name: str) -> None:
        engine = backends.create(name, getattr(self.pipeline.spec.backends, name, None), self.log_dir,
                                 gpu=self.gpu(name), secrets=self.pipeline.secrets)
        clock = time.monotonic()
        self._started[name] = engine  # stopped at the end even if it only half started
        try:
            with self.output.redirected(), self.timeline.span(ENGINE_START, detail=name):
                engine.start(self._stage_code())
                # a cluster on other hosts must see the workdir before any stage moves data there
                engine.check_shared_workdir(self.pipeline.workdir)
            self.signals.reclaim()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                engine.stop()
            del self._started[name]  # a later stage (--keep-going) tries again rather than reuse it
            if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:
                # SIGTERM while ray.init's own handler was in place: it exits; we stop cleanly
                self.signals.signum = signal.SIGTERM
                raise Terminated(signal.SIGTERM) from None
            raise
        if backends.engine(name).starts:  # an in-process engine starts nothing
            self.seconds[name] = time.monotonic() - clock
            self.on_started(name, self.seconds[name])

    def _stage_code(self) -> list[Path]:
        """The top-level packages (or module files) under root that hold the stages' functions."""
        tops = {self.pipeline.stages[s].run.split(":")[0].split(".")[0] for s in self.stages}
        found = [module_file(self.pipeline.root, top) for top in sorted(tops)]
        return [f.parent if f.name == "__init__.py" else f for f in found if f is not None]

    def started(self) -> list[Any]:
        """The engines this run started (not those a caller gave it)."""
        return list(self._started.values())

    def drop(self, name: str) -> None:
        """Stop an engine now; the next stage that needs it starts a fresh one."""
        engine = self._started.pop(name, None)
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.stop()

    def keep_only(self, needed: set[str]) -> None:
        """Stop every engine this run started that is not in `needed` (the engines of the stages
        still to come): on a small machine the next engine wants that memory."""
        for name in [n for n in self._started if n not in needed]:
            engine = self._started.pop(name)
            with contextlib.suppress(Exception), self.timeline.span(ENGINE_STOP, detail=name):
                engine.stop()

    def abandon(self) -> None:
        """The run is being ended around a stuck stage: nothing may start replacement processes."""
        for engine in list(self._started.values()):
            with contextlib.suppress(Exception):
                engine.abandon()

    def stop_all(self) -> None:
        # An engine whose stop hangs (a cluster client waiting on workers that died under it) must not
        # hold the run: past STOP_WAIT seconds, every process the run started is killed, which ends
        # the wait.
        watchdog = threading.Timer(STOP_WAIT, processes.end_all)
        watchdog.daemon = True
        watchdog.start()
        try:
            for name, engine in self._started.items():
                with contextlib.suppress(Exception), self.timeline.span(ENGINE_STOP, detail=name):
                    engine.stop()
        finally:
            watchdog.cancel()
        self._started.clear()
        self.output.close()  # after the engines: their last words are copied too
