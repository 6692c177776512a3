"""Warm iteration (hybridflow run --watch, hybridflow dev): run the pipeline, then again on every save
of its YAML, of the project code its stages reach, or of an external input (a file added to an input
directory counts), on engines kept running between runs (warmpool.py). Skipping
does the rest: a run re-executes exactly the stages whose fingerprint changed and those downstream.

Saves are found by polling modification times: no dependency, and it works on every filesystem.
A changed module is imported again in this process before the next run; engines' workers get the
new code from the pool. A YAML that does not load is reported in one line and the session waits
for the next save. SIGINT or SIGTERM ends the session with every engine stopped.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from ..backends.stagelog import private_dir
from ..data import storage
from ..definition.codereach import CodeIndex
from ..definition.pipeline import Pipeline
from ..errors import HybridflowError, InterruptedRun
from ..results import Listener, RunOptions, RunResult, new_run_id
from ..store.workdir import claim
from .stopping import OutsideImports, Terminated
from .warmpool import WarmPool

POLL_SECONDS = 0.5
SETTLE_SECONDS = 0.2  # an editor's save may be several writes: read the files once they are done


class WatchReport:
    """What a watch session tells its user (the CLI prints it); every method may be left as is."""

    def listener(self) -> Listener:
        """A fresh listener for the next run's progress and summary."""
        return Listener()

    def waiting(self, files: list[Path]) -> None:
        """The session waits for one of `files` to change."""

    def changed(self, files: list[Path]) -> None:
        """Files that changed: a run follows."""

    def invalid(self, error: HybridflowError) -> None:
        """The pipeline did not load, or a run could not start: the session waits for the next save."""

    def notice(self, text: str) -> None:
        """Something the session did on its own (an engine restarted, and why)."""


class WatchSession:
    def __init__(self, file: Path, params: list[str], *, options: RunOptions, report: WatchReport,
                 poll: float = POLL_SECONDS, subscribers=lambda pipeline, listener: ()) -> None:
        """options: each run's (its force for the first run only); subscribers: (pipeline, listener)
        -> each run's other subscribers (the API's notifications)."""
        self.file = file
        self.params = params  # given on the command line, as key=value strings
        self.options = options
        self.report, self.poll = report, poll
        self.subscribers = subscribers
        self.pool: WarmPool | None = None
        self.files: set[Path] = {file}  # what is watched: the YAML, the code its stages reach, external inputs
        self.last: RunResult | None = None

    def loop(self, runs: int | None = None) -> RunResult | None:
        """Run, then wait for a change and run again, until a signal (or `runs` runs: for tests)."""
        switching, stopping = threading.Lock(), [False]
        outside = OutsideImports(switching, lambda: not stopping[0])

        def stop(signum, frame) -> None:  # between runs (each run installs its own handlers); once
            if not stopping[0] and outside.now(signum, frame):
                stopping[0] = True
                raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)

        previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            count = 0
            while True:
                self._run_once()
                count += 1
                if runs is not None and count >= runs:
                    return self.last
                self._wait_for_change()
        except (KeyboardInterrupt, Terminated) as exc:  # between runs: nothing was running
            stopped = InterruptedRun(stopped_signal(exc))
            stopped.message = f"watch stopped by {signal.Signals(stopped_signal(exc)).name}; every engine stopped"
            raise stopped from None
        finally:
            stopping[0] = True  # a signal from here on finds the stop under way: the engines go all the same
            outside.cancel()
            with switching:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
            try:
                if self.pool is not None:
                    self.pool.shutdown()
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)

    def _run_once(self) -> None:
        from ..definition.config import load_pipeline
        from .runner import new_runner

        try:
            pipeline = load_pipeline(self.file, self.params)
        except HybridflowError as exc:
            self.report.invalid(exc)
            return
        self._forget_modules(pipeline)
        if self.pool is None:
            # claimed first: the session's logs are the first thing it writes there
            logs = private_dir(claim(pipeline.workdir) / pipeline.name / "watch" / new_run_id() / "logs")
            self.pool = WarmPool(pipeline, logs, notice=self.report.notice)
        selection = self.options.selection
        arguments = {"only": list(selection.only), "from": list(selection.start), "to": list(selection.end),
                     "params": list(pipeline.param_args)}
        listener = self.report.listener()
        runner = new_runner(pipeline, replace(self.options, arguments=arguments), listener=listener,
                            pool=self.pool.for_run, subscribers=self.subscribers(pipeline, listener))
        self.options = replace(self.options, force=False)  # --force is for the first run; later ones run what changed
        try:
            try:
                self.last = runner.run()
            finally:
                runner.listener.close()
        except HybridflowError as exc:  # a missing input, another run holding the lock: wait for a save
            if runner.ended_around_stuck_stage:
                raise  # its engines were ended with it: the session cannot go on
            self.report.invalid(exc)
        self.files = watched_files(pipeline)
        if self.last is not None and self.last.status == "interrupted" and runner.run_id == self.last.run_id:
            raise self.last.error

    def _wait_for_change(self) -> None:
        paths = sorted(self.files)
        before = _snapshot(paths)
        self.report.waiting(sorted(before))
        while (now := _snapshot(paths)) == before:
            time.sleep(self.poll)
        time.sleep(SETTLE_SECONDS)
        changed = sorted(f for f in before.keys() | now.keys() if before.get(f) != now.get(f))
        for file in changed:  # a save within the same second may keep the size: never trust the .pyc
            if file.suffix == ".py":
                with contextlib.suppress(OSError, ValueError):
                    Path(importlib.util.cache_from_source(str(file))).unlink(missing_ok=True)
        self.report.changed(changed)

    def _forget_modules(self, pipeline: Pipeline) -> None:
        """Stage modules imported by an earlier run are imported again: the stage packages, and every
        watched module (a helper another package of the project holds)."""
        root = pipeline.root.resolve()
        tops = {spec.run.split(":")[0].split(".")[0] for spec in pipeline.stages.values()}
        watched = {f.resolve() for f in self.files}
        for name, module in sys.modules.copy().items():  # atomic, unlike list(): tasks may import meanwhile
            file = getattr(module, "__file__", None)
            if not file:
                continue
            path = Path(file).resolve()
            if path in watched or (name.split(".")[0] in tops and path.is_relative_to(root)):
                sys.modules.pop(name, None)
        importlib.invalidate_caches()


def watched_files(pipeline: Pipeline) -> set[Path]:
    """The pipeline's YAML, every project file whose code a stage reaches (codereach.py), and the path
    of every external input a stage reads (a file, or a directory watched with what it holds)."""
    index = CodeIndex(pipeline.root)
    files = {Path(pipeline.file)}
    for spec in pipeline.stages.values():
        for unit in index.reach(spec.run).digests:
            files.add(pipeline.root / unit.rsplit(":", 1)[0])
        # an input in object storage is not watched: polling a bucket would cost a request a second
        files.update(path for name in spec.inputs if pipeline.is_external(name)
                     and isinstance(path := pipeline.external_path(name), Path))
    return files


def _snapshot(paths: list[Path]) -> dict[Path, tuple[int, int] | None]:
    """Modification time and size of each file, and of each file under a directory (so that a file
    added, removed or replaced there is a change too)."""
    state: dict[Path, tuple[int, int] | None] = {}
    for path in paths:
        for file in storage.files_under(path) if path.is_dir() else [path]:
            try:
                stat = file.stat()
                state[file] = (stat.st_mtime_ns, stat.st_size)
            except OSError:
                state[file] = None  # removed, or replaced by a rename under way
    return state


def stopped_signal(exc: BaseException) -> int:
    return getattr(exc, "signum", signal.SIGINT)

