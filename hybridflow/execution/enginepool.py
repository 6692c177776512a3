"""The engines of one run: each started the first time a stage needs it, reused by the stages after
it, replaced after a timeout (the old one may still hold the stage's work), and stopped, every one,
when the run ends. Engines a caller started (tests, a notebook's session) are used, never stopped.
An engine whose settings have a `cluster:` section gets its cluster brought up first (provisioning)
and attaches to it; the cluster is taken down right after the engine stops, whichever way it stops."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import backends, processes
from .. import engines as registry
from ..backends.engineoutput import EngineOutput, TerminalStreams
from ..definition.lineageids import LineageTarget
from ..definition.pipeline import Pipeline
from ..definition.sqlstage import is_sql
from ..definition.stagecode import module_file
from ..errors import first_line
from ..reporting.timeline import CLUSTER_DOWN, CLUSTER_UP, ENGINE_START, ENGINE_STOP, Timeline
from .provisioning import cluster_nodes, cluster_spec
from .stopping import SignalState, Terminated

STOP_WAIT = 90.0  # seconds the engines of a run may take to stop before their processes are killed


def stop_deadline(pipeline) -> float:
    """Seconds a run asked to stop may take to end: its engines' stop, then the longest take-down
    of a cluster it brought up, and a margin for recording it."""
    clusters = [cluster_spec(pipeline, stage.backend) for stage in pipeline.stages.values()]
    return STOP_WAIT + max((c.down_timeout for c in clusters if c is not None), default=0) + RECORD_MARGIN


RECORD_MARGIN = 30.0  # seconds, past the engines' and clusters' own bounds, for the run's end to be recorded
# Engines started ahead of the stages that need them run at the lowest CPU priority there is (their
# processes inherit it): Linux's SCHED_IDLE policy, and this niceness where it is refused. On a small
# machine a JVM or a Ray head starting beside the running stage otherwise takes half its CPU
# (docs/benchmarks.md, "Engine settings"); when their own stage comes, their priority is restored.
BACKGROUND_NICENESS = 19


@dataclass
class EarlyStart:
    """An engine starting in the background: set `done` once started (seconds) or failed (error).
    `unwanted`: no stage of the run needs it any more (a failure blocked them), so its own thread
    stops it as soon as it is up; `lock` orders that against `done`."""

    done: threading.Event = field(default_factory=threading.Event)
    seconds: float | None = None
    error: BaseException | None = None
    thread: threading.Thread | None = None  # the thread starting it, which lives until the engines stop
    behind: bool = False  # started at background priority, behind another engine's stage
    phase: str = "cluster"  # how far it got: "cluster" (brought up for it), "engine" (its own start), "checks"
    unwanted: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class EnginePool:
    def __init__(self, pipeline: Pipeline, stages: list[str], log_dir: Path, *, signals: SignalState,  # noqa: PLR0913 - a run's engine settings and the run's hooks, keyword-only
                 given: dict[str, Any] | None = None, gpu: Callable[[str], Any] = lambda name: None,
                 on_started: Callable[[str, float], None] = lambda name, seconds: None,
                 timeline: Timeline | None = None, clusters=None, shared_workdir: Path | None = None) -> None:
        """shared_workdir: the workdir a cluster on other hosts must see (a local one; None in object
        storage, which its workers reach themselves)."""
        self.pipeline = pipeline
        self.shared_workdir = shared_workdir
        self.stages = stages
        self.log_dir = log_dir
        self.signals = signals
        self.gpu = gpu  # engine name -> its GPU resources (a gpu.EngineGpu), or None
        self.on_started = on_started
        self.timeline = timeline or Timeline()
        self.clusters = clusters  # a provisioning.RunClusters: the run's clusters (None: it brings none up)
        self.seconds: dict[str, float] = {}  # engine -> start-up seconds, for engines started here
        self.output = EngineOutput(log_dir / "engines.log", pipeline.secrets)  # redacted engines.log
        self._given = dict(given or {})
        self._started: dict[str, Any] = {}
        # starts redirect this process's fds 1 and 2 (process-wide): the first start to begin points
        # them at engines.log, the last to end points them back
        self._redirect_guard = threading.Lock()
        self._redirect: contextlib.ExitStack | None = None
        self._launches = 0
        self._early: dict[str, EarlyStart] = {}  # starting in the background, until a stage takes it
        self._background: list[EarlyStart] = []  # every background start of the run, taken or not
        self._engines_stopped = threading.Event()  # the starting threads may end: the engines are stopped
        self._streams: TerminalStreams | None = None
        self._teardowns: list[threading.Thread] = []  # clusters being taken down aside (_take_down)

    def start_early(self, names: list[str]) -> None:
        """Start these engines now, in the background, each in its own thread (the order is the order
        stages need them): a JVM comes up while earlier stages compute, and a stage waits only for its
        own engine. They start side by side (one after another, Ray was not ready when the retrain's
        tune stage came); where clusters are brought up for the run, the first of them to be needed
        starts first and the others once it is up. Engines a caller gave, in-process engines and
        attached clusters (cheap to reach) are left to start on first use. Must be called before the
        progress display takes over the terminal."""
        first = names[0] if names else None  # the engine of the stage that runs first: needed now
        names = [name for name in dict.fromkeys(names) if name not in self._given and name not in self._started]
        todo = [name for name in names
                if registry.engine(name).starts and not registry.engine(name).attached(self._settings(name))]
        if not todo:
            return
        # An in-process engine starts at once, here, before the background thread takes the start lock:
        # its stages would otherwise wait behind a JVM's start.
        for name in names:
            if not registry.engine(name).starts:
                with contextlib.suppress(Exception):  # a failure is met again when a stage needs it
                    self._start_engine(name)
        # While an engine starts, fds 1 and 2 point at engines.log (so do its processes' for good).
        # This process's own writes (the display, the summary) keep going to the terminal.
        self._streams = TerminalStreams()
        self._early = {name: EarlyStart() for name in todo}
        self._background = list(self._early.values())
        # Where every engine starts on this machine, the others start under SCHED_IDLE beside the
        # first (see BACKGROUND_NICENESS), which then hardly slows it. Clusters brought up for the run
        # keep their hosts' normal priority (a user cannot raise it again, and starved nodes were
        # dropped by their heads), so they wait for the engine needed first among them, also behind a
        # first stage on an in-process engine (docs/benchmarks.md, "Engine settings").
        clusters = any(cluster_spec(self.pipeline, name) is not None for name in todo)
        leader = self._early[todo[0]] if clusters else None
        for name, early in self._early.items():
            early.thread = threading.Thread(target=self._start_early, daemon=True,
                                            args=(name, early, name == first, None if early is leader else leader),
                                            name=f"hybridflow-engine-start-{name}")
            early.thread.start()

    def _start_early(self, name: str, early: EarlyStart, needed_now: bool, leader: EarlyStart | None) -> None:
        """In its own thread: start `name` for the stage that will take it; after `leader`, if given."""
        if not needed_now:  # not needed by the stage that runs now: it must not slow that stage down
            early.behind = True
            _in_background(BACKGROUND_NICENESS)
        if leader is not None:
            # nor its engine's start, which uses both cores of a small machine: they start once it is
            # up, side by side
            leader.done.wait()
        if self.signals.signum is not None:  # the run is stopping: start nothing more
            early.error = Terminated(self.signals.signum)
        else:
            try:
                early.seconds = self._start_engine(name, early=early)
            except BaseException as exc:  # handed to the stage that needs this engine
                early.error = exc
        with early.lock:
            unwanted = early.unwanted
            if not unwanted:
                early.done.set()
        if unwanted:  # keep_only gave it up while it started: stopped here, before anyone sees it done
            self._stop_started(name)
            early.done.set()
        # Engines tie their daemons' lives to the thread that launched them (Ray's GCS and raylet
        # get PR_SET_PDEATHSIG, which fires when that thread ends): this one lasts until they stop.
        self._engines_stopped.wait()

    def get(self, name: str):
        """The engine `name`, started on first use (or waited for, when it is starting early)."""
        if name in self._given:
            return self._given[name]
        early = self._early.get(name)
        if early is not None and early.unwanted:  # given up while it started (keep_only): once it stopped,
            early.done.wait()                       # a fresh start below
            del self._early[name]
            early = None
        if early is not None:
            if not early.done.is_set() and early.behind:
                _to_foreground()  # its stage is next: its start must not wait behind anything now
            while not early.done.wait(0.2):
                self.signals.check()  # a stop request is not held up by an engine that is starting
            # taken out only once started: an engine still starting is never stopped under its start
            # (keep_only marks it unwanted instead; a stop during ray.init hung the run)
            del self._early[name]
            seconds, error = early.seconds, early.error
            if error is not None and early.behind and early.phase == "engine" and self._worth_retrying(error):
                # starved behind a busy stage, an engine's own start-up timers can run out (Ray gives
                # its raylet 30 s): an early start is an optimisation, so it is tried once more here.
                # A cluster's `up` or the checks after the start fail the same way twice: not retried.
                logging.getLogger("hybridflow").warning(
                    "%s failed to start in the background (%s); starting it again for its stage", name,
                    first_line(error))
                seconds, error = self._start_now(name)
            self._started_now(name, seconds, error)
        elif name not in self._started:
            self._started_now(name, *self._start_now(name))
        return self._started[name]

    def _start_now(self, name: str) -> tuple[float | None, BaseException | None]:
        try:
            return self._start_engine(name), None
        except BaseException as exc:
            return None, exc

    def _worth_retrying(self, error: BaseException) -> bool:
        """A failed early start is tried again unless the run is stopping."""
        return self.signals.signum is None and not isinstance(error, (Terminated, SystemExit, KeyboardInterrupt))

    def _wait_for_background_starts(self) -> None:
        for early in self._background:
            early.done.wait()

    def _settings(self, name: str):
        return self.pipeline.engine_settings(name)

    def _start_engine(self, name: str, early: EarlyStart | None = None) -> float:
        """Create and start an engine (any thread); its seconds to start. A failed start stops it (and
        takes down the cluster brought up for it). `early`: told how far it got."""
        early = early or EarlyStart()
        settings = self._settings(name)
        cluster = cluster_spec(self.pipeline, name)
        clock = time.monotonic()
        made: tuple[str, ...] = ()
        if cluster is not None:
            with self.timeline.span(CLUSTER_UP, detail=name) as facts:
                brought = self.clusters.bring_up(name, cluster)
                facts["nodes"] = cluster_nodes(brought)
                attach, made = self.clusters.credentials(name)  # the run's own, for its own cluster
                settings = settings.attached_to(brought["address"], **attach)
        engine = backends.create(name, settings, self.log_dir,
                                 gpu=self.gpu(name), secrets=[*self.pipeline.secrets, *made],
                                 store=self.pipeline.store if self.pipeline.uses_object_storage else None,
                                 lineage=LineageTarget.of(self.pipeline))  # nested under each stage's run
        self._started[name] = engine  # stopped at the end even if it only half started
        try:
            with self._launching(name), processes.launching_engine(), \
                    self.timeline.span(ENGINE_START, detail=name):
                early.phase = "engine"
                engine.start(self._stage_code())
                early.phase = "checks"
                engine.check_versions()  # an attached cluster's workers run what this driver runs
                # a cluster on other hosts must see a local workdir before any stage moves data there
                if self.shared_workdir is not None:
                    engine.check_shared_workdir(self.shared_workdir)
        except BaseException:
            with contextlib.suppress(Exception):
                engine.stop()
            self._take_down(name)
            self._started.pop(name, None)  # a later stage (--keep-going) tries again rather than reuse it
            raise
        return time.monotonic() - clock

    def _take_down(self, name: str, aside: bool = False) -> None:
        """The cluster brought up for `name`, if any, down (its engine has stopped): now, or `aside` in a
        thread of its own, since it frees other machines, not this one's: the next stage need not wait
        for it, and several go down side by side (stop_all waits for them). Either way it stops being
        the engine's at once, so a fresh start of the engine brings up a cluster of its own."""
        cluster = cluster_spec(self.pipeline, name)
        if cluster is None or self.clusters is None:
            return
        finish = self.clusters.detach(name, cluster)

        def down() -> None:
            with self.timeline.span(CLUSTER_DOWN, detail=name):
                finish()
        if not aside:
            down()
            return
        thread = threading.Thread(target=down, daemon=True, name=f"hybridflow-cluster-down-{name}")
        thread.start()
        self._teardowns.append(thread)

    @contextlib.contextmanager
    def _launching(self, name: str):
        """fds 1 and 2 at engines.log while engines launch their processes (any thread). The redirect
        is process-wide: shared by the starts under way, undone when the last of them ends."""
        with self._redirect_guard:
            if self._launches == 0:
                self._redirect = contextlib.ExitStack()
                self._redirect.enter_context(self.output.redirected())
            self._launches += 1
        try:
            yield
        finally:
            with self._redirect_guard:
                self._launches -= 1
                if self._launches == 0:
                    self._redirect.close()
                    self._redirect = None

    def _started_now(self, name: str, seconds: float | None, error: BaseException | None) -> None:
        """In the main thread, once an engine's start ended: take back the signal handlers an engine
        installs, and report the start (or raise its failure, as the stage's)."""
        try:
            self.signals.reclaim()
            if error is not None:
                raise error
        except BaseException as exc:
            if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:
                # SIGTERM while ray.init's own handler was in place: it exits; we stop cleanly
                self.signals.signum = signal.SIGTERM
                raise Terminated(signal.SIGTERM) from None
            raise
        if registry.engine(name).starts:  # an in-process engine starts nothing
            self.seconds[name] = seconds
            self.on_started(name, seconds)

    def _stage_code(self) -> list[Path]:
        """The top-level packages (or module files) under root that hold the stages' functions."""
        tops = {self.pipeline.stages[s].run.split(":")[0].split(".")[0] for s in self.stages
                if not is_sql(self.pipeline.stages[s].run)}  # a query ships with its stage
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
            self._take_down(name)

    def keep_only(self, needed: set[str]) -> None:
        """Stop every engine this run started that is not in `needed` (the engines of the stages
        still to come): on a small machine the next engine wants that memory. One still starting
        early is never stopped under its start: its own thread stops it once it is up."""
        for name, early in list(self._early.items()):
            if name in needed:
                continue
            with early.lock:
                if not early.done.is_set():
                    early.unwanted = True
                    continue
            del self._early[name]
        for name in [n for n in list(self._started) if n not in needed and n not in self._early]:  # starts add to it
            self._stop_started(name)

    def _stop_started(self, name: str) -> None:
        engine = self._started.pop(name, None)
        if engine is not None:
            with contextlib.suppress(Exception), self.timeline.span(ENGINE_STOP, detail=name):
                engine.stop()
            self._take_down(name, aside=True)

    def abandon(self) -> None:
        """The run is being ended around a stuck stage: nothing may start replacement processes."""
        for engine in list(self._started.values()):
            with contextlib.suppress(Exception):
                engine.abandon()

    def stop_all(self) -> None:
        # An engine whose stop hangs (a cluster client waiting on workers that died under it) must not
        # hold the run: past STOP_WAIT seconds, every process the run started is killed, which ends
        # the wait. So does an engine still starting in the background.
        watchdog = threading.Timer(STOP_WAIT, processes.end_all)
        watchdog.daemon = True
        watchdog.start()
        try:
            self._wait_for_background_starts()  # an engine half started cannot be stopped from here
            for name, engine in self._started.items():
                with contextlib.suppress(Exception), self.timeline.span(ENGINE_STOP, detail=name):
                    engine.stop()
        finally:
            watchdog.cancel()
        for name in list(self._started):
            self._take_down(name, aside=True)
        for thread in self._teardowns:  # its own time limit bounds each: no watchdog kills a `down`
            thread.join()
        self._teardowns = []
        self._started.clear()
        if self._background:
            self._engines_stopped.set()
            for early in self._background:
                early.thread.join()
            self._background = []
        if self._streams is not None:
            self._streams.restore()
            self._streams = None
        self.output.close()  # after the engines: their last words are copied too


def _to_foreground() -> None:
    """Back to normal CPU priority: this process's threads and every process below it that an early
    start lowered (they are waited for now). Where raising a priority is refused (an unprivileged
    user without RLIMIT_NICE), it stays lowered, and a start that fails for it is tried again."""
    if not sys.platform.startswith("linux"):
        return
    own = os.getpriority(os.PRIO_PROCESS, 0)
    for pid in [os.getpid(), *processes.descendants()]:
        for task in _tasks(pid):
            with contextlib.suppress(OSError):
                if os.sched_getscheduler(task) == os.SCHED_IDLE:
                    os.sched_setscheduler(task, os.SCHED_OTHER, os.sched_param(0))
            with contextlib.suppress(OSError):
                if os.getpriority(os.PRIO_PROCESS, task) > own:
                    os.setpriority(os.PRIO_PROCESS, task, own)


def _tasks(pid: int) -> list[int]:
    try:
        return [int(task) for task in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # gone meanwhile
        return []


def _in_background(niceness: int) -> None:
    """Lower the calling thread's CPU priority to SCHED_IDLE and `niceness` (Linux: a thread's own;
    the threads and processes it starts inherit both). Elsewhere, or where refused, nothing changes."""
    if not sys.platform.startswith("linux"):
        return  # setpriority would lower the whole process there
    with contextlib.suppress(OSError):
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, max(niceness, os.getpriority(os.PRIO_PROCESS, thread)))
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread
